"""Benchmark: simulate a job, then analyse it (ingest + align + report data) with
each reader path, side by side, at 1M and 3M op records (and 10M on request).

Usage: python bench/analyze_bench.py [--sizes 1000000,3000000] [--ten-million]
                                     [--paths duckdb,native] [--baseline-src DIR]
                                     [--ranks 64] [--hosts 8] [--workdir DIR] [--keep]
                                     [--reuse] [--repeat N]

Paths: `duckdb` reads op records with DuckDB's JSON reader (RANKWATCH_NATIVE=0),
`native` with the native reader (rankwatch.store.native); both use this tree's
align. `--baseline-src DIR` adds a `baseline` path: the `src` directory of another
rankwatch version (e.g. `git archive <rev> src | tar -x -C /tmp/base`), run as is.

Each analysis runs in a fresh child process so its peak RSS (getrusage maxrss:
resident memory including mapped file pages) is its own, with the glibc malloc
settings the rankwatch CLI gives its own process (rankwatch.alloc). Prints per path
the seconds of ingest, align and the report data (summarize), end-to-end records/s,
CPU seconds (user + system, all threads: steadier than wall time on a shared
machine), peak RSS and the share of the machine's CPU time the hypervisor stole
during the timed part (`steal`, from /proc/stat; n/a off Linux), then the seconds of
`analyze --html`'s report on top (its data queries, figures and page: the `+ HTML`
column, outside the end-to-end figures), then each path's ratios against the first
path, then one JSON line per size for bench/RESULTS.md. The timed part starts once
the analysis's libraries are imported: those rankwatch imports up front (DuckDB,
NumPy) and those it imports on first use (pyarrow, numpy.ma: about 0.06 s on the
development VM, `imports_s` in the JSON), a cost per process, not per record.
DuckDB's memory limit and spill directory come from the RANKWATCH_MEMORY_LIMIT /
RANKWATCH_SPILL_DIR settings (rankwatch.store.engine).
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
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


def _config(records: int, ranks: int, hosts: int) -> Any:
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


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, all) clock ticks of every CPU so far, from /proc/stat (Linux); None
    elsewhere. Steal is time a virtual machine's CPUs were ready to run but the
    hypervisor ran something else: on a shared VM it slows the same work by tens
    of percent, so each run says how much of its window was stolen."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[7], sum(fields)


def _steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Percent of all CPUs' ticks between the two readings that were stolen."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def _peak_rss_mb(children: bool) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if children else 0
    return max(own, kids) / 1024.0  # Linux reports KiB


def phase_simulate(records: int, ranks: int, hosts: int, out: str) -> dict[str, Any]:
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


def phase_analyze(out: str) -> dict[str, Any]:
    _cli_malloc_settings()
    from rankwatch.align import align
    from rankwatch.align.summary import summarize
    from rankwatch.store import EngineSettings, ingest

    imported = time.perf_counter()
    import numpy.ma  # noqa: F401 - NumPy imports it on a first np.unique
    import pyarrow  # noqa: F401 - the native reader's batches

    imports_s = time.perf_counter() - imported
    settings = EngineSettings.from_env()
    ticks0 = _cpu_ticks()
    cpu0, start = _cpu_s(), time.perf_counter()
    store = ingest([out], progress=False, settings=settings)
    cpu1, ingested = _cpu_s(), time.perf_counter()
    run = store.run()
    clock = align(run)
    cpu2, aligned = _cpu_s(), time.perf_counter()
    summary = summarize(run, clock)
    cpu3, done = _cpu_s(), time.perf_counter()
    steal = _steal_pct(ticks0, _cpu_ticks())
    html = _html_report(run, summary)
    return {
        "records": store.count("ops"),
        "native_files": len(getattr(store, "native_files", [])),
        "ingest_s": ingested - start,
        "align_s": aligned - ingested,
        "summary_s": done - aligned,
        "total_s": done - start,
        "ingest_cpu_s": cpu1 - cpu0,
        "align_cpu_s": cpu2 - cpu1,
        "summary_cpu_s": cpu3 - cpu2,
        "total_cpu_s": cpu3 - cpu0,
        "imports_s": imports_s,
        "steal_pct": steal,
        **html,
        "memory_limit": settings.memory_limit,
        "problems": len(store.problems),
        "peak_rss_mb": _peak_rss_mb(children=False),
    }


def _cli_malloc_settings() -> None:
    """The glibc settings the rankwatch CLI applies to its own process (rankwatch.alloc),
    so that the benchmark measures what `rankwatch analyze` does; a version without
    them (older baselines) runs as it is."""
    try:
        from rankwatch.alloc import keep_freed_memory
    except ImportError:
        return
    keep_freed_memory()


def _html_report(run: Any, summary: dict[str, Any]) -> dict[str, float]:
    """Seconds and CPU seconds of `rankwatch analyze --html`'s report (its data queries,
    figures and page) on top of the end-to-end analysis, written to a scratch file."""
    from rankwatch.export.html import write_html

    with tempfile.TemporaryDirectory(prefix="rankwatch-bench-") as scratch:
        cpu0, start = _cpu_s(), time.perf_counter()
        write_html(run, summary, Path(scratch) / "report.html")
        return {"html_s": time.perf_counter() - start, "html_cpu_s": _cpu_s() - cpu0}


def _child(args: list[str], src: Path = SRC, env_extra: dict[str, str] | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    env["RANKWATCH_BENCH_SRC"] = str(src.resolve())
    env.update(env_extra or {})
    done = subprocess.run(
        [sys.executable, __file__, *args], env=env, check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pct(value: float | None) -> str:
    return f"{value:5.1f}%" if value is not None else "   n/a"


def _rate(records: int, seconds: float) -> str:
    return f"{records / seconds:>10,.0f} rec/s" if seconds > 0 else "n/a"


def _analyze(path: str, out: Path, baseline: Path | None) -> dict[str, Any]:
    args = ["--phase", "analyze", str(out)]
    if path == "baseline":
        assert baseline is not None
        # the baseline's own package, this file's phase code
        return _child(args, src=baseline)
    return _child(args, env_extra={"RANKWATCH_NATIVE": "0" if path == "duckdb" else "1"})


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the least total CPU time (the one least disturbed by other load)."""
    return min(runs, key=lambda r: r["total_cpu_s"])


def bench(
    records: int, ranks: int, hosts: int, paths: list[str], opts: argparse.Namespace
) -> dict[str, Any]:
    out = opts.workdir / f"job-{records}"
    if opts.reuse and (out / "truth.json").exists():  # records kept by an earlier --keep run
        size = sum(f.stat().st_size for f in out.iterdir())
        sim = {"records": records, "seconds": 0.0, "bytes": size, "peak_rss_mb": 0.0}
    else:
        shutil.rmtree(out, ignore_errors=True)
        sim = _child(["--phase", "simulate", str(records), str(ranks), str(hosts), str(out)])
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
    for _ in range(opts.repeat):  # paths interleaved round by round
        for path in paths:
            runs[path].append(_analyze(path, out, opts.baseline_src))
    results = {path: _best(r) for path, r in runs.items()}
    for path, r in results.items():  # every round's, beside the best: the spread
        r["rounds_total_s"] = [run["total_s"] for run in runs[path]]
    n = next(iter(results.values()))["records"]
    print(f"\n{records:>11,} records requested, {n:,} written ({sim['bytes'] / 1e9:.2f} GB)")
    if sim["seconds"]:
        print(
            f"  simulate {sim['seconds']:7.1f} s {_rate(sim['records'], sim['seconds'])}"
            f"   peak RSS {sim['peak_rss_mb']:,.0f} MB (largest process)"
        )
    print(
        f"  {'path':9s} {'ingest':>8s} {'align':>8s} {'report':>8s} {'total':>8s} "
        f"{'end to end':>16s} {'CPU s':>7s} {'peak RSS':>9s} {'+ HTML':>8s} {'steal':>6s}"
    )
    for path, r in results.items():
        assert r["records"] == n, f"{path} loaded {r['records']} records, not {n}"
        print(
            f"  {path:9s} {r['ingest_s']:7.1f}s {r['align_s']:7.1f}s {r['summary_s']:7.1f}s "
            f"{r['total_s']:7.1f}s {_rate(n, r['total_s'])} {r['total_cpu_s']:7.1f} "
            f"{r['peak_rss_mb']:7,.0f}MB {r['html_s']:7.1f}s {_pct(r.get('steal_pct'))}"
        )
    if opts.repeat > 1:
        for path, r in results.items():
            rates = [n / t for t in r["rounds_total_s"]]
            print(
                f"  {path} over {len(rates)} rounds: {min(rates):,.0f} to {max(rates):,.0f} rec/s"
            )
    first, base = next(iter(results.items()))
    for path, r in list(results.items())[1:]:
        print(
            f"  {path} vs {first}: end to end {base['total_s'] / r['total_s']:.2f}x faster, "
            f"CPU {base['total_cpu_s'] / r['total_cpu_s']:.2f}x less "
            f"(ingest {base['ingest_cpu_s'] / r['ingest_cpu_s']:.2f}x, "
            f"align {base['align_cpu_s'] / r['align_cpu_s']:.2f}x), "
            f"peak RSS {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x; "
            f"HTML report {base['html_s'] / r['html_s']:.2f}x faster "
            f"({base['html_cpu_s'] / r['html_cpu_s']:.2f}x less CPU)"
        )
    if not opts.keep:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "records": n,
        "ranks": ranks,
        "hosts": hosts,
        "cpus": os.cpu_count(),
        "simulate": sim,
        "analyze": results,
    }


def _prefer_src(src: str) -> None:
    """Import rankwatch from `src` even where an editable install's import hook
    would hand out another tree (for the baseline path)."""
    import importlib.util

    sys.path.insert(0, src)
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None or "editable" not in type(finder).__module__:
            continue
        spec = find_spec("rankwatch", None)
        if spec is not None and not str(spec.origin).startswith(src):
            sys.meta_path.remove(finder)
    spec = importlib.util.find_spec("rankwatch")
    assert spec is not None and str(spec.origin).startswith(src), spec


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--phase":
        if os.environ.get("RANKWATCH_BENCH_SRC"):
            _prefer_src(os.environ["RANKWATCH_BENCH_SRC"])
        name, rest = sys.argv[2], sys.argv[3:]
        if name == "simulate":
            result = phase_simulate(int(rest[0]), int(rest[1]), int(rest[2]), rest[3])
        else:
            result = phase_analyze(rest[0])
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default="1000000,3000000")
    parser.add_argument("--ten-million", action="store_true", help="also run 10M records")
    parser.add_argument("--paths", default="duckdb,native", help="reader paths, in order")
    parser.add_argument("--baseline-src", type=Path, default=None, help="another version's src")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the simulated records")
    parser.add_argument(
        "--reuse", action="store_true", help="analyse records kept in --workdir by --keep"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of runs of every path; the best counts (every round's rate is printed)",
    )
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",") if s]
    if opts.ten_million:
        sizes.append(10_000_000)
    paths = [p for p in opts.paths.split(",") if p]
    if opts.baseline_src is not None and "baseline" not in paths:
        paths.insert(0, "baseline")
    unknown = set(paths) - {"duckdb", "native", "baseline"}
    if unknown or ("baseline" in paths and opts.baseline_src is None):
        parser.error(f"--paths: unknown {sorted(unknown)} (or baseline without --baseline-src)")
    own_workdir = opts.workdir is None
    opts.workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="rankwatch-bench-"))
    opts.workdir.mkdir(parents=True, exist_ok=True)
    results = [bench(n, opts.ranks, opts.hosts, paths, opts) for n in sizes]
    print()
    for r in results:
        print(json.dumps(r))
    if own_workdir and not opts.keep:
        shutil.rmtree(opts.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
