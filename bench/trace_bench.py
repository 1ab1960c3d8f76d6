"""Benchmark of `rankwatch trace` on large synthetic Kineto traces.

Two cases (the targets of the trace-analysis issue):
  one  : one rank, one ~1 GB trace file       -> peak memory must stay under 1.5 GB
  eight: eight ranks, ~200 MB trace each      -> analysed in under 60 s on 2 cores

Each case's traces are generated once (synthetic DDP job, rankwatch.explain.synth,
with an injected slow GEMM so the analysis has something to find) into --dir, then
`python -m rankwatch trace DIR --json -q` runs in a child process; the child's wall
time and peak RSS (getrusage of children: the largest of the analysing process and
its reader workers) are reported, with whether the injected fault was found.

    python bench/trace_bench.py --dir /scratch/trace-bench [--case one|eight|both]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankwatch.explain.synth import SlowKernel, SynthConfig
from rankwatch.explain.synth_files import generate

LAYERS = 32
BYTES_PER_STEP = 1_045_000  # one rank, 32 layers, variant v2_11 (measured)
CASES = {"one": (1, 1_000_000_000), "eight": (8, 200_000_000)}


def _config(ranks: int, size: int) -> SynthConfig:
    steps = max(8, round(size / BYTES_PER_STEP))
    fault = SlowKernel(rank=ranks - 1, step=5 + steps // 2, layer=7, extra_ms=40.0)
    return SynthConfig(ranks=ranks, steps=steps, layers=LAYERS, faults=(fault,),
                       clock_offsets_us=tuple(137.0 * r for r in range(ranks)))  # fmt: skip


def _prepare(case: str, root: Path) -> tuple[Path, dict]:
    ranks, size = CASES[case]
    out = root / case
    cfg = _config(ranks, size)
    done = out / ".complete"
    if not done.exists():
        t0 = time.perf_counter()
        truth = generate(cfg, out, "v2_11")
        truth.pop("collectives", None)
        done.write_text(json.dumps({"faults": truth["faults"]}))
        print(f"[{case}] generated in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    files = sorted(p for p in out.iterdir() if p.name.endswith(".json"))
    return out, {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
                 "faults": json.loads(done.read_text())["faults"]}  # fmt: skip


def _measure(path: Path, jobs: int) -> dict:
    """Run the analysis in a child; wall time and the peak RSS of the child and the
    reader processes it started (wait4's rusage: max over the child's tree)."""
    cmd = [sys.executable, "-m", "rankwatch", "trace", str(path), "--json", "-q",
           "--jobs", str(jobs)]  # fmt: skip
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"rankwatch trace failed ({proc.returncode}): {err.read()[-2000:]}")
        s = json.loads(out.read())
    return {
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "stages_s": s["timings_s"],
        "findings": s["findings"],
    }


def _found(findings: list[dict], faults: list[dict]) -> bool:
    want = [f for f in faults if f["kind"] == "slow_kernel"]
    return all(
        any(x["root"] and x["root"]["rank"] == f["rank"] and x["root"]["step"] == f["step"]
            and abs(x["root"]["extra_ns"] - f["extra_ns"]) < 0.1 * f["extra_ns"]
            for x in findings)
        for f in want
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="where the traces are generated")
    ap.add_argument("--case", choices=["one", "eight", "both"], default="both")
    ap.add_argument("--jobs", type=int, default=0, help="reader processes (0: one per CPU)")
    args = ap.parse_args()
    cases = ["one", "eight"] if args.case == "both" else [args.case]
    results = {}
    for case in cases:
        path, info = _prepare(case, args.dir)
        m = _measure(path, args.jobs)
        m["fault_found"] = _found(m.pop("findings"), info.pop("faults"))
        results[case] = {**info, "cpus": os.cpu_count(), **m}
        print(json.dumps({case: results[case]}), flush=True)


if __name__ == "__main__":
    main()
