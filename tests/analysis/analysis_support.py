"""Helpers of the analysis tests: the simulated jobs they use, running the CLI, and
hand-written record lines in the rankwatch and NCCL Inspector v4.0 formats."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import rankwatch
from rankwatch.simulate import DesyncFault, HangFault, SimConfig, SlowFault

SRC_DIR = str(Path(rankwatch.__file__).resolve().parents[1])

# Small but complete jobs: 16 ranks on 2 hosts with TP, PP and DP communicators.
JOBS: dict[str, SimConfig] = {
    "plain": SimConfig(
        ranks=16, hosts=2, steps=60, tp=2, pp=2, seed=1, clock_offset_us=3000, drift_ppm=5
    ),
    "slow_host": SimConfig(
        ranks=8,
        hosts=2,
        steps=80,
        seed=2,
        clock_offset_us=5000,
        drift_ppm=10,
        slow=SlowFault(5, 40, "host", 3000),
    ),
    "slow_gpu": SimConfig(
        ranks=8,
        hosts=2,
        steps=80,
        seed=3,
        clock_offset_us=5000,
        drift_ppm=10,
        slow=SlowFault(2, 40, "gpu", 3000),
    ),
    "clocks": SimConfig(
        ranks=32, hosts=16, steps=400, seed=4, clock_offset_us=5000, drift_ppm=10, dp_buckets=2
    ),
    "hang": SimConfig(ranks=8, hosts=2, steps=40, tp=2, seed=5, hang=HangFault(3, 20)),
    "desync": SimConfig(ranks=8, hosts=1, steps=30, seed=6, desync=DesyncFault(6, 10, "size")),
}


def truth(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "truth.json").read_text())


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m rankwatch ARGS` as a user runs it (works installed or from src/)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC_DIR, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "rankwatch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def write_lines(path: Path, lines: list[str], final_newline: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""), encoding="utf-8")
    return path


def first_op_lines(directory: Path, count: int) -> list[str]:
    """The first `count` lines of one simulated op file."""
    path = sorted(directory.glob("*.log"))[0]
    with path.open(encoding="utf-8") as stream:
        return [next(stream).rstrip("\n") for _ in range(count)]


INSPECTOR_COLL: dict[str, Any] = {
    "header": {"id": "0x7f8c496ae9f661", "comm_name": "DP Group 0", "rank": 0, "n_ranks": 2,
               "nnodes": 1},
    "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "9019a1912-dirty",
                 "rec_mechanism": "nccl_profiler_interface",
                 "dump_timestamp_us": 1748030377748202, "hostname": "example-hostname",
                 "pid": 1639453},
    "coll_perf": {"coll": "AllReduce", "coll_sn": 0, "coll_msg_size_bytes": 17179869184,
                  "coll_exec_time_us": 61974, "coll_timing_source": "kernel_gpu",
                  "coll_algobw_gbs": 277.210914, "coll_busbw_gbs": 485.119099},
}  # fmt: skip


def inspector_coll(rank: int, sn: int, *, verbose: bool = False) -> str:
    """An NCCL Inspector v4.0 collective record (seed 001's example), for rank/sn."""
    rec = copy.deepcopy(INSPECTOR_COLL)
    rec["header"]["rank"] = rank
    rec["metadata"]["pid"] += rank
    rec["coll_perf"]["coll_sn"] = sn
    if verbose:
        start = 1748030377700000 + 100_000 * sn
        rec["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": []}
        rec["event_trace_ts"] = {
            "coll_start_ts": start, "coll_stop_ts": start + 5,
            "kernel_events": [{"channel_id": ch, "kernel_start_ts": start + 10 + ch,
                               "kernel_stop_ts": start + 60_000 + ch, "kernel_record_ts": 0}
                              for ch in range(2)]}  # fmt: skip
    return json.dumps(rec)


def inspector_p2p(rank: int, sn: int, func: str, peer: int) -> str:
    rec = copy.deepcopy(INSPECTOR_COLL)
    del rec["coll_perf"]
    rec["header"]["rank"] = rank
    rec["metadata"]["pid"] += rank
    rec["p2p_perf"] = {"p2p": func, "p2p_sn": sn, "p2p_peer": peer,
                       "p2p_msg_size_bytes": 1048576, "p2p_exec_time_us": 20,
                       "p2p_timing_source": "kernel_gpu", "p2p_algobw_gbs": 52.4,
                       "p2p_busbw_gbs": 52.4}  # fmt: skip
    return json.dumps(rec)


def rccl_dump_stats(rank: int) -> str:
    rec = copy.deepcopy(INSPECTOR_COLL)
    del rec["coll_perf"]
    rec["header"]["rank"] = rank
    rec["metadata"]["pid"] += rank
    rec["dump_stats"] = {
        "coll_records": 3,
        "coll_dropped_total": 1,
        "coll_dropped_since_last_dump": 1,
        "p2p_records": 2,
        "p2p_dropped_total": 0,
        "p2p_dropped_since_last_dump": 0,
    }
    return json.dumps(rec)
