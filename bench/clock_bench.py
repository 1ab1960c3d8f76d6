"""Benchmark: the in-band clock estimator (rankwatch.align.clock) on simulated jobs
whose host clocks are off by up to 5 ms and drift by up to 10 ppm.

Usage: python bench/clock_bench.py [--seeds 10] [--seed0 100] [--workdir DIR] [--json FILE]

Each layout is simulated with --seeds seeds (each host's offset and drift drawn at
random by the simulator within those limits), ingested and aligned; then for every
host but the reference: the error of its estimated offset against the simulator's
truth at the start, the middle (t0) and the end of the job, and whether the truth
at t0 lies inside the reported bound. Goal (issue: offline analysis): error under
5 us, truth inside the bound for at least 95 % of hosts. Prints a table per layout
and over all, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

LAYOUTS = {
    # name: SimConfig keywords (the offsets and drift are the same for all)
    "dp_32r_16h": dict(ranks=32, hosts=16, steps=300, dp_buckets=2),
    "tp_pp_64r_8h": dict(ranks=64, hosts=8, steps=150, tp=2, pp=2),
    "dp_128r_64h": dict(ranks=128, hosts=64, steps=150, dp_buckets=2),
}
OFFSET_US, DRIFT_PPM = 5000, 10


def one_job(name: str, seed: int, workdir: Path) -> list[dict]:
    from rankwatch.align import align
    from rankwatch.simulate import SimConfig, simulate
    from rankwatch.store import ingest

    out = workdir / f"{name}-{seed}"
    cfg = SimConfig(seed=seed, clock_offset_us=OFFSET_US, drift_ppm=DRIFT_PPM, **LAYOUTS[name])
    simulate(cfg, out)
    truth = json.loads((out / "truth.json").read_text())
    run = ingest([out], progress=False).run()
    clock = align(run)
    span = "SELECT min(gpu_start_ns), max(gpu_end_ns) FROM ops"
    first, last = run.con.execute(span).fetchall()[0]
    hosts = {h["host"]: h for h in truth["hosts"]}
    start_ns = truth["job"]["start_ns"]

    def true_offset(host: str, at_ns: int) -> float:
        def off(h: dict) -> float:
            return h["offset_ns"] + h["drift_ppm"] * 1e-6 * (at_ns - start_ns)

        return off(hosts[host]) - off(hosts[clock.reference])

    rows = []
    for h in clock.hosts:
        if h.reference:
            continue
        errors = [
            abs(h.offset_ns + h.drift_ppm * 1e-6 * (at - clock.t0_ns) - true_offset(h.host, at))
            for at in (first, clock.t0_ns, last)
        ]
        at_t0 = abs(h.offset_ns - true_offset(h.host, clock.t0_ns))
        rows.append({
            "layout": name, "seed": seed, "host": h.host, "method": h.method,
            "error_ns": max(errors), "error_t0_ns": at_t0, "bound_ns": h.bound_ns,
            "inside": h.bound_ns is not None and at_t0 <= h.bound_ns,
            "true_offset_us": true_offset(h.host, clock.t0_ns) / 1e3,
        })  # fmt: skip
    run.con.close()
    shutil.rmtree(out, ignore_errors=True)
    return rows


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summary(rows: list[dict]) -> dict:
    err = [r["error_ns"] for r in rows]
    bounds = [r["bound_ns"] for r in rows if r["bound_ns"] is not None]
    return {
        "hosts": len(rows),
        "error_max_us": max(err) / 1e3,
        "error_p99_us": _q(err, 0.99) / 1e3,
        "error_median_us": statistics.median(err) / 1e3,
        "under_5us": sum(e < 5000 for e in err) / len(err),
        "inside_bound": sum(r["inside"] for r in rows) / len(rows),
        "bound_median_us": statistics.median(bounds) / 1e3 if bounds else None,
        "bound_max_us": max(bounds) / 1e3 if bounds else None,
        "true_offset_max_us": max(abs(r["true_offset_us"]) for r in rows),
    }


def table(by_layout: dict[str, dict]) -> str:
    head = ("| layout | hosts judged | error max | p99 | median | under 5 us | truth inside bound "
            "| bound median | bound max |")  # fmt: skip
    lines = [head, "| --- " * 9 + "|"]
    for name, s in by_layout.items():
        lines.append(
            f"| {name} | {s['hosts']} | {s['error_max_us']:.2f} us | {s['error_p99_us']:.2f} us "
            f"| {s['error_median_us']:.2f} us | {100 * s['under_5us']:.1f} % "
            f"| {100 * s['inside_bound']:.1f} % | {s['bound_median_us']:.2f} us "
            f"| {s['bound_max_us']:.2f} us |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=100)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rankwatch-clock-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.perf_counter()
    for name in LAYOUTS:
        for seed in range(args.seed0, args.seed0 + args.seeds):
            rows += one_job(name, seed, workdir)
            print(f"{name} seed {seed}: {len(rows)} hosts so far", file=sys.stderr, flush=True)
    by_layout = {name: summary([r for r in rows if r["layout"] == name]) for name in LAYOUTS}
    by_layout["all"] = summary(rows)
    print(table(by_layout))
    worst = sorted(rows, key=lambda r: -r["error_ns"])[:5]
    out = {"by_layout": by_layout, "worst": worst, "seconds": time.perf_counter() - t0,
           "offset_us": OFFSET_US, "drift_ppm": DRIFT_PPM}  # fmt: skip
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
