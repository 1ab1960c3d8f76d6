"""Read one PyTorch Profiler (Kineto) Chrome-trace JSON file, plain or gzipped, into a
RankTrace, streaming (see jsonstream), across the schema variations of PyTorch
1.13 to 2.11:

* time base: `ts` relative to top-level `baseTimeNanoseconds` (newer; the key is
  written after traceEvents, so times are shifted once at the end) or absolute
  microseconds (older);
* NCCL kernels named `ncclKernel_*` (older NCCL) or `ncclDevKernel_*` (NCCL >= 2.19):
  any kernel whose name starts with nccl/rccl, or that carries `Collective name`,
  is communication;
* collective args (`Collective name`, `dtype`, `In/Out msg nelems`, `Group size`,
  `Process Group Name/Description/Ranks`, `Seq`) on the kernel, on the
  `record_param_comms` op, on both, or nowhere (then the kernel name is all there is);
* `distributedInfo` present (rank, world size) or missing (rank from the file name);
* category spellings (`cpu_op`/`Operator`, `kernel`/`Kernel`, `cuda_runtime`/
  `Runtime`, `cuda_driver`), and CPU-only traces (no GPU events at all).

Anything that cannot be read raises RecordError naming the file and line; single
events with bad fields are skipped and counted as problems.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import IO, Any

import numpy as np

from rankwatch.errors import RecordError
from rankwatch.explain.events import (
    DEFAULT_INPUT_PATTERN,
    DEFAULT_STEP_PATTERN,
    CollMeta,
    EventBuilder,
    Kind,
    RankTrace,
    StepRange,
    family,
    no_cyclic_gc,
)
from rankwatch.explain.jsonstream import CHUNK_CHARS, JsonStreamError, scan
from rankwatch.model import Problem

_CATEGORIES: dict[str, Kind] = {
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "python_function": Kind.MODULE,
}
CATEGORY_KIND: dict[Any, Kind] = {
    **_CATEGORIES,
    **{k.capitalize(): v for k, v in _CATEGORIES.items()},
    **{k.upper(): v for k, v in _CATEGORIES.items()},
}
GPU_CATEGORIES = {Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_ANNOTATION}
COLLECTIVE_ARGS = (
    "Collective name",
    "Seq",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
    "In msg nelems",
    "dtype",
    "Group size",
)
_HOST_COMM = re.compile(r"^(gloo|mpi|ucc):", re.I)
# tensorboard_trace_handler names files "<hostname>_<pid>.<time>.pt.trace.json".
_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(\.gz)?$")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.I)
# Relative Kineto times are seconds to hours after the base; absolute ones are
# microseconds since 1970 (> 1e15 since 2001).
_ABSOLUTE_US = 1e14
MAX_LISTED_PROBLEMS = 5


def rank_from_filename(path: str) -> int | None:
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


def host_from_filename(path: str) -> str | None:
    m = _HANDLER_NAME.match(Path(path).name)
    return m.group("host") if m else None


def open_text(path: str) -> IO[str]:
    """The file as text, gunzipped when it starts with the gzip magic bytes."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the returned wrapper
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError:
        raw.close()
        raise
    binary: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw
    return io.TextIOWrapper(binary, encoding="utf-8")


def _int(value: Any) -> int | None:
    try:
        return None if value is None or value == "" else int(value)
    except (TypeError, ValueError):
        return None


def _ranks(args: dict[str, Any], size: int | None) -> tuple[int, ...] | None:
    """Process Group Ranks, which PyTorch truncates with '...' for big groups; then
    rebuilt from Global rank start/stride."""
    text = args.get("Process Group Ranks")
    if isinstance(text, list):
        return tuple(int(x) for x in text)
    if isinstance(text, str) and "..." not in text:
        found = re.findall(r"-?\d+", text)
        if found:
            return tuple(int(x) for x in found)
    start, stride = _int(args.get("Global rank start")), _int(args.get("Global rank stride"))
    if start is not None and stride and size:
        return tuple(start + i * stride for i in range(size))
    return None


def collective_meta(args: dict[str, Any], source: str) -> CollMeta:
    """A CollMeta from Kineto collective args (missing keys stay None)."""
    name = args.get("Collective name")
    size = _int(args.get("Group size"))
    pg = args.get("Process Group Name")
    peer = _int(args.get("Dst Rank", args.get("Src Rank")))
    return CollMeta(
        name=None if name is None else str(name),
        family=family(str(name)) if name else "unknown",
        pg=None if pg is None else str(pg),
        pg_desc=args.get("Process Group Description"),
        pg_ranks=_ranks(args, size),
        group_size=size,
        seq=_int(args.get("Seq")),
        in_nelems=_int(args.get("In msg nelems")),
        out_nelems=_int(args.get("Out msg nelems")),
        dtype=args.get("dtype"),
        peer=peer if peer is not None and peer >= 0 else None,
        source=source,
    )


class _Reader:
    """Turns batches of Kineto events into an EventBuilder; keeps the top-level keys."""

    def __init__(self, path: str, step_pattern: str, input_pattern: str) -> None:
        self.path = path
        self.b = EventBuilder()
        self.step_re = re.compile(step_pattern, re.I)
        self.input_re = re.compile(input_pattern)
        self.top: dict[str, Any] = {}
        self.events_seen = 0
        self.skipped: Counter[str] = Counter()
        self.bad: list[str] = []
        self.bad_count = 0
        self.arg_keys: set[str] = set()
        self.nccl_prefixes: Counter[str] = Counter()
        self._name_class: dict[tuple[int, str], tuple[int, int | None]] = {}
        self.seen_array = False

    def _classify(self, cat: Any, name: Any) -> tuple[int, int | None, bool]:
        """(kind to store or -1 to drop, step number if a step marker, GPU event?),
        decided once per (category, name): names repeat millions of times."""
        key = (cat, name)
        got = self._name_class.get(key)
        if got is not None:
            return got
        kind = CATEGORY_KIND.get(cat)
        if kind is None or type(name) is not str:
            self.skipped[str(cat)] += 1
            got = self._name_class[key] = (-1, None, False)
            return got
        step: int | None = None
        out = int(kind)
        if kind in (Kind.ANNOTATION, Kind.CPU_OP):
            m = self.step_re.match(name)
            if m:
                step = int(m.group(1))
            elif self.input_re.search(name):
                out = int(Kind.INPUT)
            elif _HOST_COMM.match(name):
                out = int(Kind.COMM_HOST)
        elif kind == Kind.GPU_ANNOTATION and self.step_re.match(name):
            out = -1  # the GPU projection of a step marker; host markers define steps
        elif kind == Kind.MODULE and not name.startswith("nn.Module:"):
            out = -1  # python stacks: too many, and only modules name a layer
        elif kind == Kind.KERNEL and name[:4].lower() in ("nccl", "rccl"):
            out = int(Kind.COMM_KERNEL)
            self.nccl_prefixes[name.split("_", 1)[0]] += 1
        got = self._name_class[key] = (out, step, kind in GPU_CATEGORIES)
        return got

    def _problem(self, index: int, message: str) -> None:
        self.bad_count += 1
        if len(self.bad) < MAX_LISTED_PROBLEMS:
            self.bad.append(f"traceEvents element {index}: {message}")

    def batch(self, events: list[Any]) -> None:
        """Add a batch of trace events. The loop is the reader's hot path (millions of
        events), so it binds everything locally and leaves rare cases to _special."""
        self.seen_array = True
        b = self.b
        classes, classify = self._name_class, self._classify
        names, name_ids = b.names, b._name_ids
        tracks = b._track_ids
        kind_a, name_a, start_a, end_a = b.kind.append, b.name.append, b.start.append, b.end.append
        track_a, corr_a, ext_a, meta_a = b.track.append, b.corr.append, b.ext.append, b.meta.append
        cpu_op = int(Kind.CPU_OP)
        first = self.events_seen
        self.events_seen += len(events)
        for i, e in enumerate(events):
            try:
                if e["ph"] != "X":
                    continue
                name = e["name"]
                stored, step, gpu = classes.get((e["cat"], name)) or classify(e["cat"], name)
                if stored < 0:
                    continue
                args = e.get("args") or _EMPTY
                if step is not None or "Collective name" in args:
                    self._special(e, args, stored, step, gpu)
                    continue
                start = int(e["ts"] * 1000 + 0.5)
                end = start + int((e.get("dur") or 0) * 1000 + 0.5)
                tkey = (gpu, e.get("pid"), e.get("tid"))
                track = tracks.get(tkey)
                if track is None:
                    track = b.track_id(*tkey)
                nid = name_ids.get(name)
                if nid is None:
                    nid = name_ids[name] = len(names)
                    names.append(name)
                if stored == cpu_op:
                    corr_a(-1)
                    flops = args.get("flops")
                    if flops:
                        b.flop_index.append(len(b.kind))
                        b.flop_value.append(flops)
                else:
                    corr_a(args.get("correlation", -1))
                ext_a(args.get("External id", -1))
                kind_a(stored)
                name_a(nid)
                start_a(start)
                end_a(end)
                track_a(track)
                meta_a(-1)
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                self._repair(b, first + i, e, exc)

    def _repair(self, b: EventBuilder, index: int, e: Any, exc: Exception) -> None:
        """An event failed half way: drop its partly appended columns, say why."""
        n = len(b.kind)
        for column in (b.name, b.start, b.end, b.track, b.corr, b.ext, b.meta):
            del column[n:]
        if e == {}:
            return  # some writers close the array with an empty object
        self._problem(index, f"{_diagnose(e, exc)}; skipped")

    def _special(self, e: dict, args: dict, stored: int, step: int | None, gpu: bool) -> None:
        """Step markers and events carrying collective args."""
        b = self.b
        start = round(e["ts"] * 1000)
        end = start + round((e.get("dur") or 0) * 1000)
        track = b.track_id(gpu, e.get("pid"), e.get("tid"))
        if step is not None:
            b.steps.append(StepRange(step, start, end, track, e["name"]))
            return
        meta = None
        if stored in (Kind.KERNEL, Kind.COMM_KERNEL, Kind.CPU_OP):
            self.arg_keys.update(k for k in COLLECTIVE_ARGS if k in args)
            meta = collective_meta(args, "cpu op" if stored == Kind.CPU_OP else "kernel args")
            stored = int(Kind.COMM_CPU) if stored == Kind.CPU_OP else int(Kind.COMM_KERNEL)
        corr = -1 if stored == Kind.COMM_CPU else args.get("correlation", -1)
        b.add(stored, e["name"], start, end, track, corr, args.get("External id", -1), meta)


_EMPTY: dict[str, Any] = {}
_NUMBER_FIELDS = ("ts", "dur")


def _diagnose(e: Any, exc: Exception) -> str:
    """What is wrong with an event, in the trace's own terms."""
    if not isinstance(e, dict):
        return f"not a JSON object ({type(e).__name__})"
    for key in ("ph", "name", "ts"):
        if key not in e:
            return f"missing field {key!r}"
    for key in _NUMBER_FIELDS:
        value = e.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"field {key!r}: {value!r} is not a number"
    return f"{type(exc).__name__}: {exc}"


def _time_shift(reader: _Reader, builder: EventBuilder) -> tuple[int, str]:
    """Nanoseconds to add to every time, and how the time base was decided."""
    base = _int(reader.top.get("baseTimeNanoseconds"))
    if base is None:
        return 0, "absolute microseconds"
    starts = builder.start
    if len(starts) and starts[len(starts) // 2] / 1000 > _ABSOLUTE_US:
        return 0, "absolute microseconds (baseTimeNanoseconds present but ts already absolute)"
    return base, "relative to baseTimeNanoseconds"


def _gpu_name(top: dict[str, Any]) -> str | None:
    props = top.get("deviceProperties")
    if isinstance(props, list):
        for p in props:
            if isinstance(p, dict) and p.get("name"):
                return str(p["name"])
    return None


def _rank(reader: _Reader, dist: dict[str, Any]) -> tuple[int | None, str]:
    rank = _int(dist.get("rank"))
    if rank is not None:
        return rank, "distributedInfo"
    rank = rank_from_filename(reader.path)
    if rank is not None:
        return rank, "file name"
    return None, "unknown"


def _problems(reader: _Reader) -> list[Problem]:
    out = [Problem(reader.path, None, "bad_event", msg) for msg in reader.bad]
    if reader.bad_count > len(reader.bad):
        out.append(
            Problem(
                reader.path,
                None,
                "bad_event",
                f"{reader.bad_count - len(reader.bad)} more bad events skipped",
            )
        )
    return out


def _kind_counts(builder: EventBuilder) -> dict[str, int]:
    counts = np.bincount(np.frombuffer(builder.kind, dtype=np.int8), minlength=len(Kind))
    return {Kind(k).name.lower(): int(n) for k, n in enumerate(counts) if n}


def _finish(reader: _Reader) -> RankTrace:
    if not reader.seen_array:
        raise RecordError(
            "no traceEvents array: not a PyTorch profiler (Chrome trace) file",
            file=reader.path,
            field="traceEvents",
        )
    if len(reader.b) == 0 and not reader.b.steps:
        raise RecordError(
            f"traceEvents has {reader.events_seen} element(s) but no complete ('X') "
            "events of a known category",
            file=reader.path,
            field="traceEvents",
        )
    dist = reader.top.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    shift, time_base = _time_shift(reader, reader.b)
    rank, rank_source = _rank(reader, dist)
    schema = {
        "time_base": time_base,
        "distributedInfo": "present" if dist else "missing",
        "nccl_kernel_prefixes": dict(reader.nccl_prefixes),
        "collective_args": sorted(reader.arg_keys),
        "events": _kind_counts(reader.b),
        "skipped_categories": dict(reader.skipped.most_common(8)),
        "schemaVersion": reader.top.get("schemaVersion"),
    }
    return reader.b.build(
        shift,
        path=reader.path,
        fmt="kineto",
        rank=rank,
        rank_source=rank_source,
        host=host_from_filename(reader.path),
        world_size=_int(dist.get("world_size")),
        gpu_name=_gpu_name(reader.top),
        schema=schema,
        problems=_problems(reader),
    )


def read_kineto(
    path: str | os.PathLike[str],
    *,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    input_pattern: str = DEFAULT_INPUT_PATTERN,
    chunk: int = CHUNK_CHARS,
) -> RankTrace:
    """Read one rank's Kineto trace (see module doc); RecordError if it is unusable."""
    name = os.fspath(path)
    reader = _Reader(name, step_pattern, input_pattern)
    try:
        with no_cyclic_gc(), open_text(name) as stream:
            for key, value in scan(stream.read, chunk=chunk):
                if key == "traceEvents" and isinstance(value, list):
                    reader.batch(value)
                elif key == "traceEvents":
                    raise RecordError("is not an array", file=name, field="traceEvents")
                elif key in (
                    "distributedInfo",
                    "deviceProperties",
                    "baseTimeNanoseconds",
                    "schemaVersion",
                ):
                    reader.top[key] = value
    except JsonStreamError as exc:
        kind = "truncated" if exc.truncated else "malformed"
        raise RecordError(
            f"{kind} JSON after {reader.events_seen:,} trace events: {exc.message}",
            file=name,
            line=exc.line,
        ) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise RecordError(
            f"damaged or truncated gzip data after {reader.events_seen:,} trace events "
            f"({exc or type(exc).__name__})",
            file=name,
        ) from None
    except UnicodeDecodeError as exc:
        raise RecordError(f"not UTF-8 text ({exc.reason})", file=name) from None
    except OSError as exc:
        raise RecordError(f"cannot read: {exc.strerror or exc}", file=name) from None
    return _finish(reader)
