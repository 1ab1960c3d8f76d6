"""Writing a simulated job to disk: per-process op and state files, in parallel.

Every worker process rebuilds the (deterministic) timeline itself and formats
only its share of the ranks, so nothing but a small summary crosses processes.
"""

from __future__ import annotations

import heapq
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rankwatch.simulate.clocks import ClockModel
from rankwatch.simulate.config import SimConfig
from rankwatch.simulate.records import DesyncPlan, rank_chunk_lines, rank_context
from rankwatch.simulate.state import RankState
from rankwatch.simulate.timeline import Engine, InFlight
from rankwatch.simulate.topology import Layout, Phase, build_layout, step_schedule

RECORDS_PER_CHUNK = 1_000_000
SUFFIXES = (".log", ".rwstate.jsonl")
# the time of a line, by which the lines of a process's ranks are merged
_LINE_TIME = {
    ".log": re.compile(rb'"dump_timestamp_us":(\d+)'),
    ".rwstate.jsonl": re.compile(rb'"ts_ns":(\d+)'),
}
HANG_KILL_AFTER_NS = 30e9  # a hung job is killed this long after its last op


@dataclass
class Job:
    """Everything deterministic about a simulated job, rebuilt identically anywhere."""

    cfg: SimConfig
    layout: Layout
    phases: list[Phase]
    clocks: ClockModel

    @classmethod
    def build(cls, cfg: SimConfig) -> Job:
        rng = np.random.default_rng([cfg.seed, 1])
        layout = build_layout(cfg, rng)
        clocks = ClockModel.draw(cfg, np.random.default_rng([cfg.seed, 2]))
        return cls(cfg, layout, step_schedule(layout), clocks)

    def file_stem(self, rank: int) -> str:
        host = self.layout.hostnames[int(self.layout.host_of[rank])]
        return f"{host}-pid{int(self.layout.pids[rank])}"

    def chunk_steps(self) -> int:
        per_step = max(1, len(self.phases) * self.cfg.ranks)
        return max(1, RECORDS_PER_CHUNK // per_step)


@dataclass
class WorkerSummary:
    ops: dict[int, int] = field(default_factory=dict)  # rank -> op records written
    p2p: dict[int, int] = field(default_factory=dict)  # rank -> of which p2p
    state: dict[str, int] = field(default_factory=dict)  # kind -> state records
    in_flight: list[InFlight] = field(default_factory=list)
    steps_run: int = 0
    end_ns: float = 0.0  # true time of the last op activity


def _add_counts(total: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


class _RankWriter:
    """Open files and formatting state of one rank inside a worker."""

    def __init__(self, job: Job, rank: int, outdir: Path) -> None:
        self.rank = rank
        self.ctx = rank_context(job.layout, job.phases, rank, job.clocks)
        tick_phase = float(np.random.default_rng([job.cfg.seed, 3, rank]).uniform(0.1, 1.0))
        self.state = RankState(
            self.ctx, job.layout, job.phases, job.clocks, tick_phase * job.cfg.interval_ms * 1e6
        )
        ops, state = (outdir / (job.file_stem(rank) + s) for s in SUFFIXES)
        if job.cfg.one_process_per_host:  # merged into the process's files (merge_parts)
            ops, state = (_part(path, rank) for path in (ops, state))
        self.ops_file = open(ops, "wb")  # noqa: SIM115 - closed in close()
        self.state_file = open(state, "wb")  # noqa: SIM115
        self.ops_written = 0
        self.p2p_written = 0
        self._write_state(self.state.comm_records())

    def _write_state(self, data: bytes) -> None:
        self.state_file.write(data)

    def close(self) -> None:
        self.ops_file.close()
        self.state_file.close()


def _write_share(cfg: SimConfig, ranks: list[int], outdir: str) -> WorkerSummary:
    """Worker entry point: run the whole timeline, write files of `ranks` only."""
    job = Job.build(cfg)
    engine = Engine(cfg, job.layout, job.phases)
    desync = DesyncPlan.of(job.layout, job.phases)
    writers = [_RankWriter(job, r, Path(outdir)) for r in ranks]
    summary, step = WorkerSummary(), 0
    try:
        while step < cfg.steps and not engine.finished:
            chunk = engine.run_chunk(step, min(job.chunk_steps(), cfg.steps - step))
            step += chunk.steps
            until = chunk.end_time + HANG_KILL_AFTER_NS if engine.finished else None
            for w in writers:
                rng = np.random.default_rng([cfg.seed, 4, w.rank, chunk.first_step])
                lines, p2p = rank_chunk_lines(w.ctx, chunk, job.phases, job.clocks, rng, desync)
                w.ops_file.write(b"".join(lines))
                w.ops_written += len(lines)
                w.p2p_written += p2p
                w._write_state(w.state.chunk_records(chunk, until))
            summary.in_flight, summary.end_ns = chunk.in_flight, chunk.end_time
        for w in writers:
            if not engine.finished:
                w._write_state(w.state.final_records(summary.end_ns + 5e6))
            summary.ops[w.rank], summary.p2p[w.rank] = w.ops_written, w.p2p_written
            _add_counts(summary.state, w.state.counts)
    finally:
        for w in writers:
            w.close()
    summary.steps_run = step
    return summary


def worker_count(cfg: SimConfig) -> int:
    if cfg.workers > 0:
        return min(cfg.workers, cfg.ranks)
    return max(1, min(os.cpu_count() or 1, cfg.ranks, 8))


def write_job(cfg: SimConfig, outdir: Path) -> list[WorkerSummary]:
    """Write every rank's files into outdir; one summary per worker."""
    outdir.mkdir(parents=True, exist_ok=True)
    workers = worker_count(cfg)
    shares = [list(range(w, cfg.ranks, workers)) for w in range(workers)]
    if workers == 1:
        summaries = [_write_share(cfg, shares[0], str(outdir))]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_write_share, cfg, share, str(outdir)) for share in shares]
            summaries = [f.result() for f in futures]
    if cfg.one_process_per_host:
        merge_parts(Job.build(cfg), outdir)
    return summaries


def _part(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.name}.rank{rank}.part")


def merge_parts(job: Job, outdir: Path) -> None:
    """One process per host: its ranks' lines, written apart, merged into the
    process's files, interleaved by time as one plugin instance writes them (each
    rank's lines keep their own order, which is by time only roughly), the parts
    removed."""
    ranks_of: dict[str, list[int]] = {}
    for rank in range(job.cfg.ranks):
        ranks_of.setdefault(job.file_stem(rank), []).append(rank)
    for stem, ranks in ranks_of.items():
        for suffix in SUFFIXES:
            parts = [_part(outdir / (stem + suffix), r) for r in ranks]
            when = _LINE_TIME[suffix]

            def key(line: bytes, when: re.Pattern[bytes] = when) -> int:
                found = when.search(line)
                return int(found.group(1)) if found else 0

            streams = [p.open("rb") for p in parts]
            try:
                with (outdir / (stem + suffix)).open("wb") as out:
                    out.writelines(heapq.merge(*streams, key=key))
            finally:
                for f in streams:
                    f.close()
            for p in parts:
                p.unlink()
