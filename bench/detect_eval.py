"""Detectors: the evaluation suite at scale, detection speed, and memory vs job length.

Usage: python bench/detect_eval.py [--suite] [--large] [--speed] [--baseline DIR]
                                   [--repeat N] [--false-alarms SEEDS]
                                   [--workdir DIR] [--json FILE]

--suite     the CI suite (tests/detect/detect_scenarios.py SUITE) plus its table
--large     the same kinds of scenario at 256 and 1,024 ranks
--speed     records/s of the streaming detectors on one core in batch mode (a simulated
            1.15M-record job, read from DuckDB once, then fed in 64k-record batches), and
            their memory on that stream (1.15M records) and on it repeated ten times as
            one longer job (11.5M records): the same detectors, the same window. CPU time
            (time.process_time) of one process pinned to one core with one BLAS/OpenMP
            thread and glibc malloc set up as the CLI sets up its process (rankwatch.alloc);
            the best of --repeat runs (other load on the machine only adds time).
            The job and its records are kept in --workdir for the next run
--baseline  with --speed: also measure another copy of the rankwatch.detect package (a
            directory holding its modules, e.g. an earlier commit's, from
            `git archive <commit> src/rankwatch/detect | tar -x -C DIR`), alternating
            with this one run by run, and print both side by side
--false-alarms  healthy jobs that stress the straggler detector's persistence (long
            jobs with heavy stalls, plain noise, delays rotating over the ranks at random
            and in turn), each simulated with SEEDS seeds (from --seed0) and analysed
            once per value of --chance-runs (default: 0, i.e. always three late steps,
            and the default Config's); prints how many jobs of each kind got a finding.
            --fa-jobs: a comma-separated subset of the job names
With no option: suite, large and speed. Prints tables, and one JSON object at the end
(or into --json).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

# one thread for numpy's BLAS / OpenMP pools, set before numpy loads (--speed is one core)
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "detect"))

from detect_scenarios import (  # noqa: E402 - the suite lives with the tests
    H2,
    SUITE,
    Extra,
    Rotating,
    Scenario,
    _cfg,
    failures,
    row,
    run_scenario,
    simulate_scenario,
    summary,
    table,
)

from rankwatch.simulate import (  # noqa: E402
    DesyncFault,
    HangFault,
    SimConfig,
    SlowFault,
    simulate,
)


def _big(ranks: int, steps: int, seed: int, hosts: int, **kw) -> SimConfig:
    base = {**H2, "hosts": hosts, **kw}
    return SimConfig(ranks=ranks, steps=steps, seed=seed, **base)


LARGE: list[Scenario] = [
    Scenario("healthy_256", _big(256, 30, 101, 32, tp=8, pp=2)),
    Scenario("healthy_noise_256", _big(256, 30, 102, 32, tp=4), Extra(heavy_noise=True)),
    Scenario("healthy_noise_long_64", _big(64, 300, 111, 8, tp=4), Extra(heavy_noise=True)),
    Scenario(
        "rotating_random_256",
        _big(256, 30, 103, 32, tp=8),
        Extra(rotating=Rotating(700, "gpu", order="random")),
    ),
    Scenario(
        "stage_imbalance_256",
        _big(256, 30, 104, 32, tp=4, pp=4),
        Extra(stage_compute=(1, 1, 1, 1.3)),
    ),
    Scenario(
        "slow_gpu_256", _big(256, 30, 105, 32, tp=8, pp=2, slow=SlowFault(77, 12, "gpu", 2000))
    ),
    Scenario(
        "slow_transfer_256", _big(256, 30, 106, 32, tp=8, slow=SlowFault(130, 12, "transfer", 1000))
    ),
    Scenario(
        "three_stragglers_256",
        _big(256, 36, 107, 32, tp=8, slow=SlowFault(5, 10, "host", 3000)),
        Extra(slow=(SlowFault(100, 14, "gpu", 2000), SlowFault(201, 18, "transfer", 1500))),
    ),
    Scenario("hang_256", _big(256, 20, 108, 32, tp=8, pp=2, hang=HangFault(150, 10))),
    Scenario("desync_256", _big(256, 20, 109, 32, tp=8, desync=DesyncFault(33, 8, "func"))),
    Scenario("healthy_1024", _big(1024, 16, 110, 128, tp=8, pp=2)),
    Scenario(
        "slow_gpu_1024", _big(1024, 20, 111, 128, tp=8, pp=2, slow=SlowFault(517, 8, "gpu", 2000))
    ),
    Scenario("hang_1024", _big(1024, 16, 112, 128, tp=8, hang=HangFault(900, 8))),
]


def run_suite(scenarios: list[Scenario], workdir: Path, label: str) -> dict:
    rows = []
    for sc in scenarios:
        t0 = time.perf_counter()
        res = run_scenario(sc, workdir)
        rows.append(row(res))
        print(
            f"{label}: {sc.name}: {len(res.findings)} finding(s), "
            f"{time.perf_counter() - t0:.1f} s ({res.records} records)",
            flush=True,
        )
    print("\n" + table(rows) + "\n")
    s = summary(rows)
    return {"rows": rows, "summary": s, "failures": failures(s)}


# ----------------------------------------------------------------- false alarms

FALSE_ALARM_JOBS: dict[str, tuple[Callable[[int], SimConfig], Extra | None]] = {
    "heavy_noise_8x1200": (lambda seed: _cfg(8, 1200, seed), Extra(heavy_noise=True)),
    "heavy_noise_tp_32x300": (lambda seed: _cfg(32, 300, seed, tp=4), Extra(heavy_noise=True)),
    "noise_tp_pp_16x600": (lambda seed: _cfg(16, 600, seed, tp=2, pp=2), None),
    "rotating_random_16x400": (
        lambda seed: _cfg(16, 400, seed, tp=2),
        Extra(rotating=Rotating(700, "gpu", order="random")),
    ),
    "rotating_cycle_8x600": (lambda seed: _cfg(8, 600, seed), Extra(rotating=Rotating(700))),
}


def _false_alarm_job(args: tuple[str, int, Path, tuple[float, ...]]) -> tuple[str, int, list]:
    """One healthy job: simulated, aligned once, detected once per chance_runs value."""
    from rankwatch.align import align
    from rankwatch.detect import detect
    from rankwatch.detect.base import Config
    from rankwatch.store import ingest

    name, seed, workdir, values = args
    make, extra = FALSE_ALARM_JOBS[name]
    out = workdir / f"{name}_s{seed}"
    shutil.rmtree(out, ignore_errors=True)  # what an interrupted run left
    simulate_scenario(Scenario(name, make(seed), extra), out)
    run = ingest([out]).run()
    clock = align(run)
    found = [detect(run, clock, config=Config(chance_runs=v)) for v in values]
    run.con.close()
    shutil.rmtree(out)  # 50 to 150 MB of records per job: hundreds of jobs fill a disk
    return name, seed, [[(f.kind, f.rank) for f in fs] for fs in found]


def false_alarms(
    workdir: Path, seeds: int, seed0: int, values: tuple[float, ...], names: list[str]
) -> dict:
    """Healthy jobs x seeds, two processes: jobs with a finding per chance_runs value."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(n, seed0 + i, workdir, values) for n in names for i in range(seeds)]
    fired = {n: [0] * len(values) for n in names}
    with ProcessPoolExecutor(2) as pool:
        for name, seed, found in pool.map(_false_alarm_job, jobs):
            for i, f in enumerate(found):
                fired[name][i] += bool(f)
            if any(found):
                print(f"false-alarms: {name} seed {seed}: {found}", flush=True)
    head = f"{'job':<26}{'seeds':>6}" + "".join(f"{'chance_runs=' + str(v):>20}" for v in values)
    lines = [head] + [
        f"{n:<26}{seeds:>6}" + "".join(f"{c:>20}" for c in fired[n]) for n in names
    ]
    print("\nhealthy jobs with a finding\n" + "\n".join(lines) + "\n")
    return {"seeds": seeds, "seed0": seed0, "chance_runs": values, "jobs": fired}


# ----------------------------------------------------------------- speed and memory


def _job(workdir: Path) -> Path:
    out = workdir / "speed-job"
    cfg = SimConfig(ranks=128, hosts=8, steps=600, tp=4, pp=2, seed=4, clock_offset_us=5000,
                    drift_ppm=5, slow=SlowFault(37, 300, "gpu", 2000))  # fmt: skip
    if not (out / "truth.json").exists():
        simulate(cfg, out)
    return out


def _windows(path: Path):
    from rankwatch.align import align
    from rankwatch.detect import Topology
    from rankwatch.detect.source import windows
    from rankwatch.store import ingest

    run = ingest([path]).run()
    align(run)
    topo = Topology.from_run(run)
    return topo, list(windows(run, topo))


def _tiled(wins, times: int):
    """The stream repeated `times` times as one longer job: seqs and times shifted
    (copies after the first; shifting them is part of the time measured, about 2 %)."""
    import numpy as np

    ops = [o for o, _, _ in wins if o is not None]
    seq_span = int(max(o.seq.max() for o in ops)) + 1
    t_end = max(float(np.nanmax(o.gend_c)) for o in ops)
    t_start = min(float(np.nanmin(o.arrival_c)) for o in ops)
    span = t_end - t_start + 1e6
    for k in range(times):
        for o, _, now in wins:
            if o is None:
                continue
            if k == 0:  # the recorded stream itself: nothing to shift (or to time)
                yield o, now
                continue
            shifted = dataclasses.replace(o, seq=o.seq + k * seq_span)
            for name in ("arrival", "gstart", "gend", "arrival_c", "gstart_c", "gend_c"):
                setattr(shifted, name, getattr(o, name) + k * span)
            yield shifted, now + k * span


def _feed(topo, stream_iter) -> tuple[int, float, list]:
    from rankwatch.detect import Stream

    stream = Stream(topo)
    n = 0
    t0 = time.process_time()
    for ops, now in stream_iter:
        stream.feed(ops, None, now)
        n += len(ops)
    findings = stream.close()
    return n, time.process_time() - t0, findings


def _one_core() -> None:
    """Pin this process to one CPU (the first it may use)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _use_detect(package: Path) -> None:
    """Import rankwatch.detect from another directory (a baseline copy of it)."""
    import importlib.abc
    import importlib.util

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN202
            if name == "rankwatch.detect":
                return importlib.util.spec_from_file_location(
                    name, package / "__init__.py", submodule_search_locations=[str(package)]
                )
            if name.startswith("rankwatch.detect."):
                return importlib.util.spec_from_file_location(
                    name, package / (name.rsplit(".", 1)[1] + ".py")
                )
            return None

    sys.meta_path.insert(0, Finder())
    for name in [m for m in sys.modules if m.split(".")[:2] == ["rankwatch", "detect"]]:
        del sys.modules[name]  # imported already (by the suite's module): load them anew


def speed_child(windows_file: Path, times: int, memory: bool) -> dict:
    """One measurement, in a process of its own (see speed), set up as the CLI sets
    up its own process (rankwatch.alloc), whichever detectors it measures."""
    from rankwatch.alloc import keep_freed_memory
    from rankwatch.detect import kernels

    _one_core()
    keep_freed_memory()
    kernels.library()  # found and loaded once per process (30 ms): not per-record work
    with windows_file.open("rb") as f:
        topo, wins = pickle.load(f)
    gc.collect()
    if memory:
        tracemalloc.start()
        n, cpu, findings = _feed(topo, _tiled(wins, times))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    else:
        n, cpu, findings = _feed(topo, _tiled(wins, times))
        peak = 0
    return {
        "records": n,
        "cpu_s": round(cpu, 3),
        "peak_traced_mb": round(peak / 2**20, 1),
        "findings": [(f.kind, f.rank, f.cause, round(f.cost_s or 0, 3)) for f in findings],
    }


def _child(windows_file: Path, times: int, memory: bool, package: Path | None) -> dict:
    cmd = [sys.executable, __file__, "--speed-child", str(windows_file), "--times", str(times)]
    cmd += ["--memory"] if memory else []
    cmd += ["--detect-from", str(package)] if package else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def speed(workdir: Path, baseline: Path | None = None, repeat: int = 3) -> dict:
    """Each variant (this rankwatch.detect, and the baseline's) in fresh processes,
    alternating, `repeat` times per job length: the best CPU time; then once more
    under tracemalloc for the peak memory."""
    windows_file = workdir / "speed-windows.pkl"
    if not windows_file.exists():
        topo, wins = _windows(_job(workdir))
        with windows_file.open("wb") as f:
            pickle.dump((topo, wins), f, protocol=pickle.HIGHEST_PROTOCOL)
    variants = {"new": None, **({"old": baseline.resolve()} if baseline else {})}
    out: dict = {}
    for label, times in (("1x", 1), ("10x", 10)):
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for _ in range(repeat if times == 1 else max(1, repeat // 2)):
            for v, package in variants.items():
                runs[v].append(_child(windows_file, times, False, package))
        for v, package in variants.items():
            best = min(runs[v], key=lambda x: x["cpu_s"])
            mem = _child(windows_file, times, True, package)
            out.setdefault(v, {})[label] = {
                **best,
                "records_per_s": round(best["records"] / best["cpu_s"]),
                "cpu_s_all": [x["cpu_s"] for x in runs[v]],
                "peak_traced_mb": mem["peak_traced_mb"],
            }
            print(f"speed {v} {label}: {out[v][label]}", flush=True)
    print("\n" + speed_table(out) + "\n")
    return out


def speed_table(out: dict) -> str:
    """Best and median CPU seconds per variant (the median resists a shared machine's
    quiet and busy moments better than the best alone), and their ratios."""
    lines = [
        "| job | records | variant | CPU s best | CPU s median | M records/s (best, median)"
        " | peak traced MB |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label in ("1x", "10x"):
        for v in out:
            m = out[v][label]
            med = statistics.median(m["cpu_s_all"])
            lines.append(
                f"| {label} | {m['records'] / 1e6:.2f} M | {v} | {m['cpu_s']:.2f} | {med:.2f} | "
                f"{m['records'] / m['cpu_s'] / 1e6:.2f}, {m['records'] / med / 1e6:.2f} | "
                f"{m['peak_traced_mb']:.1f} |"
            )
        if "old" in out:
            old, new = out["old"][label], out["new"][label]
            best = old["cpu_s"] / new["cpu_s"]
            med = statistics.median(old["cpu_s_all"]) / statistics.median(new["cpu_s_all"])
            lines.append(f"| {label} | | old / new | {best:.2f}x | {med:.2f}x | | |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", action="store_true")
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--baseline", type=Path, help="another rankwatch/detect directory")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--false-alarms", type=int, default=0, metavar="SEEDS")
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--chance-runs", default=None, help="comma-separated values")
    ap.add_argument("--fa-jobs", default=",".join(FALSE_ALARM_JOBS))
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    # one measurement in this process (used by --speed)
    ap.add_argument("--speed-child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--times", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--detect-from", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.speed_child:
        if args.detect_from:
            _use_detect(args.detect_from)
        print(json.dumps(speed_child(args.speed_child, args.times, args.memory)))
        return 0
    every = not (args.suite or args.large or args.speed or args.false_alarms)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rankwatch-detect-eval-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    if args.suite or every:
        result["suite"] = run_suite(SUITE, work / "suite", "suite")
    if args.large or every:
        result["large"] = run_suite(LARGE, work / "large", "large")
    if args.speed or every:
        result["speed"] = speed(work, args.baseline, args.repeat)
    if args.false_alarms:
        from rankwatch.detect.base import Config

        values = (
            tuple(float(v) for v in args.chance_runs.split(","))
            if args.chance_runs
            else (0.0, Config().chance_runs)
        )
        names = [n for n in args.fa_jobs.split(",") if n]
        unknown = [n for n in names if n not in FALSE_ALARM_JOBS]
        if unknown:
            ap.error(f"--fa-jobs: unknown {unknown}; known: {list(FALSE_ALARM_JOBS)}")
        result["false_alarms"] = false_alarms(
            work / "false-alarms", args.false_alarms, args.seed0, values, names
        )
    text = json.dumps(result, indent=1, default=str)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    bad = [f for part in ("suite", "large") for f in result.get(part, {}).get("failures", [])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
