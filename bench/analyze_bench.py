"""Benchmark: simulate a job, then ingest + align it, at 1M and 3M op records.

Usage: python bench/analyze_bench.py [--sizes 1000000,3000000] [--ten-million]
                                     [--ranks 64] [--hosts 8] [--workdir DIR] [--keep]
                                     [--reuse]

Each phase runs in a fresh child process so its peak RSS (getrusage maxrss of the
process and, for the simulator's writer processes, its children) is its own.
Prints records/s, CPU seconds (user + system, all threads: steadier than wall time
on a shared machine) and peak RSS per phase, then one JSON line per size for
bench/RESULTS.md. DuckDB's memory limit and spill directory come from the
RANKWATCH_MEMORY_LIMIT / RANKWATCH_SPILL_DIR settings (rankwatch.store.engine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _config(records: int, ranks: int, hosts: int):
    from rankwatch.simulate import SimConfig
    from rankwatch.simulate.records import rank_slots
    from rankwatch.simulate.writer import Job

    probe = SimConfig(ranks=ranks, hosts=hosts, steps=1, clock_offset_us=5000, drift_ppm=10)
    job = Job.build(probe)
    per_step = sum(len(rank_slots(job.layout, job.phases, r)) for r in range(ranks))
    steps = max(1, records // per_step)
    return SimConfig(ranks=ranks, hosts=hosts, steps=steps, clock_offset_us=5000, drift_ppm=10)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb(children: bool) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if children else 0
    return max(own, kids) / 1024.0  # Linux reports KiB


def phase_simulate(records: int, ranks: int, hosts: int, out: str) -> dict:
    from rankwatch.simulate import simulate

    cfg = _config(records, ranks, hosts)
    start = time.perf_counter()
    result = simulate(cfg, out)
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    return {
        "records": result.op_records,
        "seconds": seconds,
        "bytes": size,
        "peak_rss_mb": _peak_rss_mb(children=True),
    }


def phase_analyze(out: str) -> dict:
    from rankwatch.align import align
    from rankwatch.align.summary import summarize
    from rankwatch.store import EngineSettings, ingest

    settings = EngineSettings.from_env()
    cpu0, start = _cpu_s(), time.perf_counter()
    store = ingest([out], progress=False, settings=settings)
    cpu1, ingested = _cpu_s(), time.perf_counter()
    run = store.run()
    clock = align(run)
    cpu2, aligned = _cpu_s(), time.perf_counter()
    summarize(run, clock)
    done = time.perf_counter()
    records = store.count("ops")
    return {
        "records": records,
        "ingest_s": ingested - start,
        "align_s": aligned - ingested,
        "summary_s": done - aligned,
        "total_s": done - start,
        "ingest_cpu_s": cpu1 - cpu0,
        "align_cpu_s": cpu2 - cpu1,
        "total_cpu_s": _cpu_s() - cpu0,
        "memory_limit": settings.memory_limit,
        "problems": len(store.problems),
        "peak_rss_mb": _peak_rss_mb(children=False),
    }


def _child(args: list[str]) -> dict:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, __file__, *args], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rate(records: int, seconds: float) -> str:
    return f"{records / seconds:>12,.0f} rec/s" if seconds > 0 else "n/a"


def bench(records: int, ranks: int, hosts: int, workdir: Path, keep: bool, reuse: bool) -> dict:
    out = workdir / f"job-{records}"
    if reuse and (out / "truth.json").exists():  # records kept by an earlier --keep run
        size = sum(f.stat().st_size for f in out.iterdir())
        sim = {"records": records, "seconds": 0.0, "bytes": size, "peak_rss_mb": 0.0}
    else:
        shutil.rmtree(out, ignore_errors=True)
        sim = _child(["--phase", "simulate", str(records), str(ranks), str(hosts), str(out)])
    ana = _child(["--phase", "analyze", str(out)])
    n = ana["records"]
    print(f"{records:>11,} records requested, {n:,} written ({sim['bytes'] / 1e9:.2f} GB)")
    print(
        f"  simulate {sim['seconds']:7.1f} s {_rate(sim['records'], sim['seconds'])}"
        f"   peak RSS {sim['peak_rss_mb']:,.0f} MB (largest process)"
    )
    cpu = {k: ana[f"{k}_cpu_s"] for k in ("ingest", "align", "total")}
    for phase in ("ingest", "align"):
        seconds = ana[f"{phase}_s"]
        print(f"  {phase:8s} {seconds:7.1f} s {_rate(n, seconds)}   cpu {cpu[phase]:.1f} s")
    print(
        f"  analyze  {ana['total_s']:7.1f} s {_rate(n, ana['total_s'])}   cpu {cpu['total']:.1f} s"
        f"   peak RSS {ana['peak_rss_mb']:,.0f} MB (memory limit {ana['memory_limit']})"
    )
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "records": n,
        "ranks": ranks,
        "hosts": hosts,
        "cpus": os.cpu_count(),
        "simulate": sim,
        "analyze": ana,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--phase":
        name, rest = sys.argv[2], sys.argv[3:]
        if name == "simulate":
            result = phase_simulate(int(rest[0]), int(rest[1]), int(rest[2]), rest[3])
        else:
            result = phase_analyze(rest[0])
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000000,3000000")
    parser.add_argument("--ten-million", action="store_true", help="also run 10M records")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the simulated records")
    parser.add_argument(
        "--reuse", action="store_true", help="analyse records kept in --workdir by --keep"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.ten_million:
        sizes.append(10_000_000)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rankwatch-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = [bench(n, args.ranks, args.hosts, workdir, args.keep, args.reuse) for n in sizes]
    for r in results:
        print(json.dumps(r))
    if args.workdir is None and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
