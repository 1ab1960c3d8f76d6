"""Write simulated events (synth.Simulation) as PyTorch Profiler (Kineto) trace JSON,
in the schema variants the reader must handle.

The layout follows Kineto's own writer: a top-level object with metadata, then
`traceEvents` (one multi-line object per event), then `traceName` and, in newer
versions, `baseTimeNanoseconds` after the array. Variants differ only in what
they write (see KinetoVariant), so one simulation can be written every way.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rankwatch.explain.synth import (
    COMPUTE_STREAM,
    PG_DESC,
    PG_NAME,
    START_UNIX_NS,
    SimEvent,
    SynthConfig,
)

PG_KEYS = ("Process Group Name", "Process Group Description", "Process Group Ranks")


@dataclass(frozen=True)
class KinetoVariant:
    base_time: bool = True  # ts relative to baseTimeNanoseconds (else absolute us)
    nccl_prefix: str = "ncclDevKernel"  # ncclKernel before NCCL 2.19
    kernel_args: bool = True  # collective args on the NCCL kernel event
    cpu_args: bool = True  # collective args on record_param_comms
    seq: bool = True  # "Seq" arg
    pg: bool = True  # Process Group Name / Description / Ranks args
    dist_info: str | None = "full"  # full, basic, or None (key missing)
    step_cat: str = "user_annotation"  # category of ProfilerStep#N and other ranges
    gpu_annotations: bool = True  # gpu_user_annotation projections
    flops: bool = True  # "flops" arg on GEMM ops
    gzip: bool = False
    file_names: str = "handler"  # handler: host_pid.time.pt.trace.json; rank: rank<N>...
    driver_launch: bool = True  # NCCL launches as cuda_driver cuLaunchKernelEx


# Feature sets modelled on what traces of these PyTorch releases carry.
VARIANTS: dict[str, KinetoVariant] = {
    "v2_11": KinetoVariant(),
    "v2_4": KinetoVariant(seq=False, gzip=True),
    "v2_1": KinetoVariant(
        nccl_prefix="ncclKernel",
        kernel_args=False,
        pg=False,
        seq=False,
        dist_info="basic",
        file_names="rank",
        driver_launch=False,
    ),
    "v1_13": KinetoVariant(
        base_time=False,
        nccl_prefix="ncclKernel",
        kernel_args=False,
        cpu_args=False,
        seq=False,
        pg=False,
        dist_info=None,
        step_cat="cpu_op",
        gpu_annotations=False,
        flops=False,
        gzip=True,
        file_names="rank",
        driver_launch=False,
    ),
    "cpu": KinetoVariant(gpu_annotations=False, file_names="rank"),
}


def _nccl_name(sim_name: str, v: KinetoVariant) -> str:
    """ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...) or the older
    ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)."""
    parts = sim_name.split("_")[1:]
    if v.nccl_prefix == "ncclKernel":
        func, rest = parts[0], parts[1:]
        algo = [p for p in rest if p.isupper()]
        other = [p for p in rest if not p.isupper()]
        return "_".join(["ncclKernel", func, *algo, *other]) + "(ncclWorkElem)"
    return "_".join(["ncclDevKernel", *parts]) + "(ncclDevKernelArgsStorage<4096ul>)"


_KEYS: dict[str, str] = {}
_PLAIN = re.compile(r'^[^"\\\x00-\x1f]*$')


def _value(v: Any) -> str:
    """JSON text of a value; the common cases without json.dumps (the writer's hot path)."""
    t = type(v)
    if t is int:
        return str(v)
    if t is str and _PLAIN.match(v):
        return f'"{v}"'
    return json.dumps(v)


def _args_text(args: dict[str, Any]) -> str:
    parts = []
    for k, v in args.items():
        key = _KEYS.get(k)
        if key is None:
            key = _KEYS[k] = json.dumps(k)
        parts.append(f"      {key}: {_value(v)}")
    return ",\n".join(parts)


class KinetoWriter:
    """Streams one rank's trace file: header, events step by step, footer."""

    def __init__(self, out_dir: Path, cfg: SynthConfig, rank: int, variant: KinetoVariant) -> None:
        self.cfg = cfg
        self.rank = rank
        self.v = variant
        self.pid = 4000 + rank
        self.device = rank % 8
        self.offset = cfg.offset_ns(rank)
        # Kineto picks a base per trace; a different one per rank checks the reader.
        self.base = START_UNIX_NS - 1_000_000_000 + rank * 1_234_567
        self.path = out_dir / self._file_name()
        self.out = self._open()
        self.first = True
        self.last_ts = 0
        self._names: dict[str, str] = {}
        self.out.write(self._header())
        self._metadata()

    def _file_name(self) -> str:
        if self.v.file_names == "handler":
            stem = f"{self.cfg.host_of(self.rank)}_{self.pid}.{START_UNIX_NS // 1_000_000}"
        else:
            stem = f"rank{self.rank}"
        return stem + ".pt.trace.json" + (".gz" if self.v.gzip else "")

    def _open(self) -> IO[str]:
        if self.v.gzip:
            return io.TextIOWrapper(
                gzip.GzipFile(self.path, "wb", compresslevel=1), encoding="utf-8"
            )
        return open(self.path, "w", encoding="utf-8", buffering=1 << 20)

    def _dist_info(self) -> dict[str, Any] | None:
        n = self.cfg.ranks
        if self.v.dist_info is None:
            return None
        info: dict[str, Any] = {
            "backend": "gloo" if self.cfg.mode == "cpu" else "nccl",
            "rank": self.rank,
            "world_size": n,
        }
        if self.v.dist_info == "full":
            info |= {
                "pg_count": 1,
                "pg_config": [
                    {
                        "pg_name": PG_NAME,
                        "pg_desc": PG_DESC,
                        "backend_config": "cuda:nccl",
                        "pg_size": n,
                        "ranks": list(range(n)),
                    }
                ],
                "nccl_version": "2.28.9",
            }
        return info

    def _header(self) -> str:
        top: dict[str, Any] = {"schemaVersion": 1}
        if self.cfg.mode != "cpu":
            top["deviceProperties"] = [
                {
                    "id": self.device,
                    "name": self.cfg.gpu_name,
                    "totalGlobalMem": 150754820096,
                    "computeMajor": 9,
                    "computeMinor": 0,
                    "maxThreadsPerBlock": 1024,
                    "maxThreadsPerMultiprocessor": 2048,
                    "regsPerBlock": 65536,
                    "warpSize": 32,
                    "sharedMemPerBlock": 49152,
                    "numSms": 132,
                }
            ]
        dist = self._dist_info()
        if dist is not None:
            top["distributedInfo"] = dist
        top |= {
            "record_shapes": 1,
            "with_stack": 0,
            "cupti_version": 26,
            "cuda_runtime_version": 13000,
            "trace_id": f"SYNTH{self.rank:04d}",
            "displayTimeUnit": "ms",
        }
        body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in top.items())
        return "{\n" + body + ',\n  "traceEvents": [\n'

    def _ts(self, true_ns: int) -> str:
        local = true_ns + self.offset
        if self.v.base_time:
            return f"{(local - self.base) / 1000:.3f}"
        return str(local // 1000)

    def _dur(self, start: int, end: int) -> str:
        if self.v.base_time:
            return f"{(end - start) / 1000:.3f}"
        return str((end + self.offset) // 1000 - (start + self.offset) // 1000)

    def _name(self, name: str) -> str:
        got = self._names.get(name)
        if got is None:
            got = self._names[name] = json.dumps(name)
        return got

    def _put(self, text: str) -> None:
        if not self.first:
            self.out.write(",\n")
        self.first = False
        self.out.write(text)

    def _x(
        self, cat: str, name: str, pid: Any, tid: Any, start: int, end: int, args: dict[str, Any]
    ) -> None:
        self.last_ts = max(self.last_ts, end)
        self._put(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": {self._name(name)}, '
            f'"pid": {json.dumps(pid)}, "tid": {json.dumps(tid)},\n'
            f'    "ts": {self._ts(start)}, "dur": {self._dur(start, end)},\n'
            f'    "args": {{\n{_args_text(args)}\n    }}\n  }}'
        )

    def _metadata(self) -> None:
        meta = [
            ("process_name", self.pid, 0, {"name": "python"}),
            ("thread_name", self.pid, 1, {"name": "thread 1 (python)"}),
            ("thread_name", self.pid, 2, {"name": "thread 2 (autograd)"}),
        ]
        if self.cfg.mode != "cpu":
            meta += [
                ("process_labels", self.device, 0, {"labels": f"GPU {self.device}"}),
                ("thread_name", self.device, COMPUTE_STREAM, {"name": "stream 7"}),
            ]
        for name, pid, tid, args in meta:
            self._put(
                f'  {{\n    "name": "{name}", "ph": "M", "ts": {self._ts(START_UNIX_NS)}, '
                f'"pid": {pid}, "tid": {tid},\n    "args": {json.dumps(args)}\n  }}'
            )

    def _coll_args(self, args: dict[str, Any]) -> dict[str, Any]:
        out = dict(args)
        if not self.v.seq:
            out.pop("Seq", None)
        if not self.v.pg:
            for k in PG_KEYS:
                out.pop(k, None)
        return out

    def _gpu(self, ev: SimEvent) -> None:
        args: dict[str, Any] = {
            "External id": ev.ext,
            "device": self.device,
            "context": 1,
            "stream": ev.lane,
            "correlation": ev.corr,
        }
        name = ev.name
        if ev.cat == "memcpy":
            self._x(
                "gpu_memcpy",
                name,
                self.device,
                ev.lane,
                ev.start,
                ev.end,
                args | {"bytes": (ev.args or {}).get("bytes", 0)},
            )
        else:
            args |= {
                "registers per thread": 128,
                "shared memory": 0,
                "blocks per SM": 1.2,
                "warps per SM": 9.6,
                "grid": [132, 1, 1],
                "block": [256, 1, 1],
                "est. achieved occupancy %": 0,
            }
            if name.startswith("nccl"):
                name = _nccl_name(name, self.v)
                if self.v.kernel_args and ev.args:
                    args |= self._coll_args(ev.args)
            self._x("kernel", name, self.device, ev.lane, ev.start, ev.end, args)
        flow = {
            "ph": "f",
            "id": ev.corr,
            "pid": self.device,
            "tid": ev.lane,
            "ts": float(self._ts(ev.start)),
            "cat": "ac2g",
            "name": "ac2g",
            "bp": "e",
        }
        self._put("  " + json.dumps(flow))

    def _host(self, ev: SimEvent) -> None:
        tid = ev.lane
        if ev.cat in ("step", "annotation", "input", "comm_host"):
            cat = self.v.step_cat
            self._x(
                cat,
                ev.name,
                self.pid,
                tid,
                ev.start,
                ev.end,
                {"External id": ev.ext, "Record function id": 0},
            )
        elif ev.cat == "cpu_op":
            args: dict[str, Any] = {
                "External id": ev.ext,
                "Record function id": 0,
                "Fwd thread id": 0,
            }
            if self.v.flops and ev.args and "flops" in ev.args:
                args["flops"] = ev.args["flops"]
            self._x("cpu_op", ev.name, self.pid, tid, ev.start, ev.end, args)
        elif ev.cat == "comm_meta":
            args = {"External id": ev.ext, "Record function id": 0}
            if self.v.cpu_args and ev.args:
                args |= self._coll_args(ev.args)
            self._x("cpu_op", ev.name, self.pid, tid, ev.start, ev.end, args)
        elif ev.cat == "runtime":
            driver = self.v.driver_launch and ev.name == "cudaLaunchKernelExC"
            cat, name = ("cuda_driver", "cuLaunchKernelEx") if driver else ("cuda_runtime", ev.name)
            self._x(
                cat,
                name,
                self.pid,
                tid,
                ev.start,
                ev.end,
                {"External id": ev.ext, "cbid": 211, "correlation": ev.corr},
            )
            if ev.corr > 0 and ("Launch" in ev.name or "Memcpy" in ev.name):
                flow = {
                    "ph": "s",
                    "id": ev.corr,
                    "pid": self.pid,
                    "tid": tid,
                    "ts": float(self._ts(ev.start)),
                    "cat": "ac2g",
                    "name": "ac2g",
                }
                self._put("  " + json.dumps(flow))

    def write(self, events: list[SimEvent]) -> None:
        gpu = self.cfg.mode != "cpu"
        for ev in events:
            if ev.cat in ("kernel", "memcpy"):
                if gpu:
                    self._gpu(ev)
            elif ev.cat == "gpu_annotation":
                if gpu and self.v.gpu_annotations:
                    self._x(
                        "gpu_user_annotation",
                        ev.name,
                        self.device,
                        ev.lane,
                        ev.start,
                        ev.end,
                        {"External id": 0},
                    )
            elif ev.cat != "nccl_range":
                self._host(ev)

    def close(self) -> Path:
        self._put(
            '  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
            f'    "pid": "", "tid": "", "ts": {self._ts(self.last_ts + 1000)}\n  }}'
        )
        tail = f'\n  ],\n  "traceName": {json.dumps(self.path.name)}'
        if self.v.base_time:
            tail += f',\n  "baseTimeNanoseconds": {self.base}'
        self.out.write(tail + "\n}\n")
        self.out.close()
        return self.path
