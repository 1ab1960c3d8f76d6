"""A multi-rank job on the fake NCCL driver: the real plugin, no GPU.

Each rank is one driver process loading the installed plugin; the ranks share a
rendezvous directory so a rank that is late makes every rank's collectives end
late, as on a real job. Used by `rankwatch demo` and by tests.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rankwatch.collect.plugin import driver_path, plugin_path
from rankwatch.errors import RankwatchError

# The collectives of one step of the driver's job scenario, in order (plugin/tests/
# fn_job.c, step_ops): an op's step is its seq over its function's count here.
STEP_OPS = ("AllGather", "AllReduce", "ReduceScatter", "AllReduce")


def step_of(func: str, seq: int) -> int | None:
    """The step of the job scenario's op `func` #seq (None for another function)."""
    per_step = STEP_OPS.count(func)
    return seq // per_step if per_step else None


@dataclass(frozen=True)
class Straggler:
    """From step `from_step` on, `rank` is late by `delay_us` for `cause`."""

    rank: int
    from_step: int
    cause: str = "gpu"  # host, gpu or transfer
    delay_us: int = 2000


@dataclass(frozen=True)
class FakeJob:
    ranks: int = 4
    steps: int = 80
    step_pause_us: int = 1000
    comm_id: str = "0x5eed0000c0ffee01"
    job_id: str = "rankwatch-demo"
    straggler: Straggler | None = None


def _rank_args(job: FakeJob, rank: int, rendezvous: Path) -> list[str]:
    args = [
        str(driver_path()), "--scenario", "job", "--rank", str(rank),
        "--nranks", str(job.ranks), "--comm-id", job.comm_id, "--steps", str(job.steps),
        "--rendezvous", str(rendezvous), "--interval-sleep-us", str(job.step_pause_us),
        "--comm-name", "world",
    ]
    s = job.straggler
    if s is not None:
        args += ["--slow-rank", str(s.rank), "--slow-from-step", str(s.from_step),
                 "--slow-cause", s.cause, "--slow-us", str(s.delay_us)]
    return [*args, str(plugin_path())]


def run_fake_job(job: FakeJob, dump_dir: Path, timeout_s: float = 300) -> None:
    """Runs every rank to completion, recording into `dump_dir`."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RANKWATCH_DUMP_DIR": str(dump_dir), "RANKWATCH_JOB_ID": job.job_id}
    with tempfile.TemporaryDirectory(prefix="rankwatch-rdv-") as rdv:
        procs = [
            subprocess.Popen(_rank_args(job, rank, Path(rdv)), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for rank in range(job.ranks)
        ]
        failures = []
        for rank, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                failures.append(f"rank {rank} exited {proc.returncode}: {err.strip()[-300:]}")
        if failures:
            raise RankwatchError("fake job failed: " + "; ".join(failures))
