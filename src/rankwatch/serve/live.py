"""Everything the monitor knows, fed with decoded lines from any transport.

`LiveState.accept(items, wall)` takes what a transport produced (chunks of op and
state lines tagged with their source, and open/close events of stream
connections) and is the only entry point: the socket listener, the file
watcher, and any later relay (a NATS subscriber, an agent) feed the same state.
Processes are routed to jobs by the job id of their hello, op records or comm
records; a job id seen again after its job ended starts a new job (`id#2`).

Nothing here does I/O besides DuckDB, and nothing here blocks on the network;
the monitor calls it from one processing thread.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import pyarrow as pa

from rankwatch import __version__
from rankwatch.model import Finding
from rankwatch.serve.convert import BatchLoader
from rankwatch.serve.intake import Chunk, Event, Source
from rankwatch.serve.job import (
    PROC,
    JobConfig,
    LiveJob,
    finding_key,
    findings_dicts,
    jsonable,
)
from rankwatch.store.ingest import timed

UNKNOWN_JOB = "unknown"
MESSAGE_EVERY_S = 10.0  # a source's rejected lines are reported at most this often


@dataclass(frozen=True)
class NewFinding:
    job: str
    finding: Finding


@dataclass
class StateConfig:
    job: JobConfig = field(default_factory=JobConfig)
    max_jobs: int = 8  # jobs kept (ended ones are forgotten first)
    max_ranks_series: int = 256  # per-rank metric series per job


class LiveState:
    """See module doc."""

    def __init__(
        self,
        cfg: StateConfig | None = None,
        log: TextIO | None = None,
        on_batch: Callable[[str, dict[str, pa.Table]], None] | None = None,
    ) -> None:
        self.cfg = cfg or StateConfig()
        self.loader = BatchLoader()
        self.jobs: dict[str, LiveJob] = {}
        self.proc_job: dict[PROC, str] = {}
        self.rejected: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.alerted: dict[str, set[tuple]] = {}
        self.found_total: dict[tuple[str, str], int] = {}
        self.log = log or sys.stderr
        self.on_batch = on_batch
        self.batches = 0
        self.batch_seconds = 0.0
        self.last_batch_s = 0.0
        self._said: dict[str, float] = {}
        self.started = time.time()
        self.timings: dict[str, float] = {}  # seconds per processing stage, all jobs

    def close(self) -> None:
        self.loader.close()

    # ------------------------------------------------------------------ input
    def note_dropped(self, n: int) -> None:
        """The transport shed n records: any running job may be missing some."""
        for job in self.jobs.values():
            if job.phase != "ended":
                job.monitor_dropped += n

    def accept_fast(self, chunks: list[Chunk], wall: float | None = None) -> None:
        """State lines ahead of the op backlog, for hang detection only (see intake.py).
        Only processes already placed in a running job count; lines are not counted
        here (the main path counts them when it gets to them)."""
        wall = time.time() if wall is None else wall
        with timed(self.timings, "hang_lane"):
            self.loader.load(chunks)
            routes = {p: k for p, k in self.proc_job.items() if self.jobs[k].phase == "live"}
            for key, tables in self.loader.by_job(routes).items():
                if "progress" in tables:
                    self._guard(self.jobs[key], self.jobs[key].early_progress, tables["progress"])

    def accept(self, items: list[Chunk | Event], wall: float | None = None) -> None:
        """Fold a transport's items in, in order (see module doc)."""
        wall = time.time() if wall is None else wall
        start = time.perf_counter()
        chunks = [i for i in items if isinstance(i, Chunk)]
        for ev in items:
            if isinstance(ev, Event) and ev.kind == "open":
                self._opened(ev.source, wall)
        if chunks:
            self._load(chunks, wall)
        for ev in items:
            if isinstance(ev, Event) and ev.kind == "close":
                self._closed(ev.source, wall)
        self.batches += 1
        self.last_batch_s = time.perf_counter() - start
        self.batch_seconds += self.last_batch_s

    def tick(self, wall: float | None = None) -> list[NewFinding]:
        """Time-driven steps of every job; returns findings not reported before."""
        wall = time.time() if wall is None else wall
        for job in list(self.jobs.values()):
            self._guard(job, job.tick, wall)
        return self._new_findings()

    def finish_all(self, wall: float | None = None) -> list[NewFinding]:
        """The monitor stops: end every job (final findings)."""
        wall = time.time() if wall is None else wall
        for job in self.jobs.values():
            self._guard(job, job.finish, wall)
        return self._new_findings()

    def _opened(self, source: Source, wall: float) -> None:
        hello = source.hello
        if hello is None:
            return
        job = self._job_of((hello.hostname, hello.pid), hello.job_id or UNKNOWN_JOB, wall)
        if job is not None:
            job.source_opened(
                (hello.hostname, hello.pid), wall, hello.stream_dropped_records, hello.connection
            )

    def _closed(self, source: Source, wall: float) -> None:
        proc = source.proc
        key = self.proc_job.get(proc) if proc is not None else None
        if key is not None and key in self.jobs:
            self.jobs[key].source_closed(proc, wall)

    def _load(self, chunks: list[Chunk], wall: float) -> None:
        with timed(self.timings, "parse"):
            batch = self.loader.load(chunks)
        for r in batch.rejected:
            for reason, n in r.counts.items():
                self.rejected[reason] = self.rejected.get(reason, 0) + n
            self._say(r.source, r.counts, wall)
        hello_job = {c.source.proc: c.source.hello.job_id for c in chunks if c.source.hello}
        routes: dict[PROC, str] = {}
        for host, pid, job_id in self.loader.processes():
            job = self._job_of((host, pid), hello_job.get((host, pid)) or job_id, wall)
            if job is not None:
                routes[(host, pid)] = job.key
        for proc, key in self.proc_job.items():
            routes.setdefault(proc, key)
        with timed(self.timings, "route"):
            per_job = self.loader.by_job(routes)
        for key, tables in per_job.items():
            job = self.jobs.get(key)
            if job is None or job.phase == "ended":
                n = sum(t.num_rows for t in tables.values())
                self.dropped["job_ended"] = self.dropped.get("job_ended", 0) + n
                continue
            self._guard(job, job.add, tables, wall)
            if self.on_batch is not None:
                self.on_batch(key, tables)
        self._unrouted(routes)

    def _unrouted(self, routes: dict[PROC, str]) -> None:
        """State records of processes no op or comm record has placed yet are dropped:
        without a job they have no communicator to describe."""
        placed = set(routes)
        missing = self.loader.con.execute(
            "SELECT host, pid, count(*) FROM (SELECT host, pid FROM progress UNION ALL "
            "SELECT host, pid FROM clock UNION ALL SELECT host, pid FROM stats) GROUP BY ALL"
        ).fetchall()
        n = sum(int(c) for h, p, c in missing if (h, p) not in placed)
        if n:
            self.dropped["no_job_yet"] = self.dropped.get("no_job_yet", 0) + n

    def _job_of(self, proc: PROC, job_id: str | None, wall: float) -> LiveJob | None:
        key = self.proc_job.get(proc)
        if key is not None:
            return self.jobs.get(key)
        if job_id is None:
            return None
        key = self._instance(job_id or UNKNOWN_JOB, wall)
        if key is None:
            return None
        self.proc_job[proc] = key
        return self.jobs[key]

    def _instance(self, job_id: str, wall: float) -> str | None:
        """The running job of this id, or a new one (`id#n` when the id was used)."""
        n, key = 1, job_id
        while key in self.jobs and self.jobs[key].phase == "ended":
            n += 1
            key = f"{job_id}#{n}"
        if key in self.jobs:
            return key
        if not self._make_room():
            self.dropped["too_many_jobs"] = self.dropped.get("too_many_jobs", 0) + 1
            return None
        self.jobs[key] = LiveJob(key, job_id, self.cfg.job, wall)
        self.jobs[key].timings = self.timings
        return key

    def _make_room(self) -> bool:
        if len(self.jobs) < self.cfg.max_jobs:
            return True
        ended = [j for j in self.jobs.values() if j.phase == "ended"]
        if not ended:
            return False
        oldest = min(ended, key=lambda j: j.ended_wall or 0.0)
        del self.jobs[oldest.key]
        self.alerted.pop(oldest.key, None)
        self.proc_job = {p: k for p, k in self.proc_job.items() if k != oldest.key}
        return True

    def _guard(self, job: LiveJob, fn: Callable, *args: Any) -> None:
        """A job that fails keeps its findings so far; the monitor keeps serving."""
        try:
            fn(*args)
        except Exception as exc:  # any failure of one job must not stop the others
            job.error = f"{type(exc).__name__}: {exc}"
            print(
                f"rankwatch monitor: job {job.key}: {job.error}; its records are still "
                "in the plugin's files",
                file=self.log,
            )
            traceback.print_exc(file=self.log)
            if job.phase != "ended":
                job.phase = "ended"
                job.ended_wall = time.time()

    def _say(self, source: Source, counts: dict[str, int], wall: float) -> None:
        if wall - self._said.get(source.key, -1e9) < MESSAGE_EVERY_S:
            return
        if len(self._said) > 4096:  # sources come and go: forget the ones long quiet
            self._said = {k: t for k, t in self._said.items() if wall - t < MESSAGE_EVERY_S}
        self._said[source.key] = wall
        what = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(counts.items()))
        print(f"rankwatch monitor: {source.name}: lines rejected: {what}", file=self.log)

    # ------------------------------------------------------------------ findings
    def _new_findings(self) -> list[NewFinding]:
        with timed(self.timings, "findings"):
            return self._diff_findings()

    def _diff_findings(self) -> list[NewFinding]:
        out = []
        for key, job in self.jobs.items():
            seen = self.alerted.setdefault(key, set())
            for f in job.findings():
                k = finding_key(f)
                if k in seen or (f.kind == "desync" and job.stream_gaps):
                    continue
                seen.add(k)
                total = (key, f.kind)
                self.found_total[total] = self.found_total.get(total, 0) + 1
                out.append(NewFinding(key, f))
        return out

    # ------------------------------------------------------------------ views
    def snapshot(self, intake: Any = None, transport: dict | None = None) -> dict[str, Any]:
        """Plain data for the web page, the JSON API and the metrics (one consistent view)."""
        monitor = {
            "version": __version__,
            "started": self.started,
            "now": time.time(),
            "batches": self.batches,
            "batch_seconds": self.batch_seconds,
            "last_batch_s": self.last_batch_s,
            "lines_rejected": dict(self.rejected),
            "stage_seconds": dict(self.timings),
            "records_dropped": dict(self.dropped),
            "findings_total": [
                {"job": j, "kind": k, "count": n} for (j, k), n in sorted(self.found_total.items())
            ],
        }
        if intake is not None:
            c = intake.counters
            monitor["records_received"] = dict(c.received)
            monitor["records_dropped"] = _sum_dicts(self.dropped, c.dropped)
            monitor["lines_rejected"] = _sum_dicts(self.rejected, c.rejected_lines)
            monitor["intake_bytes"] = intake.queued_bytes
            monitor["intake_limit_bytes"] = intake.limit
        monitor.update(transport or {})
        jobs = [self._job_view(j) for j in self.jobs.values()]
        return {"monitor": monitor, "jobs": jobs}

    def _job_view(self, job: LiveJob) -> dict[str, Any]:
        lat = job.lateness
        phase = lat.phase()
        recent = {p: lat.recent_mean_s(p) for p in ("arrival", "gpu_start")}
        findings = job.findings()
        flagged = {f.rank: f.kind for f in findings if f.rank is not None}
        ranks = []
        rows = sorted(job.rank_rows(), key=lambda x: (x[0] is None, x[0], x[1].host, x[1].pid))
        for r, p, device, first in rows:
            lateness = {
                k: (float(v[r]) if r is not None and 0 <= r < len(v) and v[r] == v[r] else None)
                for k, v in recent.items()
            }
            totals = {
                k: (
                    {"seconds": float(lat.total_ns[k][r]) / 1e9, "count": int(lat.total_n[k][r])}
                    if r is not None and 0 <= r < lat.n_ranks
                    else {"seconds": 0.0, "count": 0}
                )
                for k in ("arrival", "gpu_start")
            }
            ranks.append(
                {
                    "rank": r,
                    "host": p.host,
                    "pid": p.pid,
                    "gpu": device,
                    "records": p.records,  # of its process
                    "last_seen": p.last_wall,
                    "exited": p.exited,
                    "connected": p.streams_open > 0,
                    "stream_connection": p.connection,
                    "lateness_s": lateness,
                    "lateness_total": totals,
                    "status": flagged.get(r, "ok"),
                    # the plugin counts drops per process: on its first rank only, so
                    # that sums over ranks count each drop once
                    "dropped": (
                        {"pool_full": p.dropped_pool_full, "stream": p.dropped_stream}
                        if first
                        else {"pool_full": 0, "stream": 0}
                    ),
                }
            )
        hangs = [f for f in findings if f.kind == "hang"]
        return {
            "key": job.key,
            "job_id": job.job_id,
            "phase": job.phase,
            "error": job.error,
            "started": job.first_wall,
            "last_record": job.last_wall,
            "ended": job.ended_wall,
            "rebuilds": job.rebuilds,
            "stream_gaps": job.stream_gaps,
            "records": dict(job.records),
            "last_progress_ns": job.last_progress_ns,
            "comms": len(job.comms),
            "ranks": ranks,
            "findings": findings_dicts(findings),
            "hangs": findings_dicts(hangs),
            "total_cost_s": job.total_cost_s,
            "heatmap": jsonable(lat.grid(phase)),
            "bandwidth": jsonable(job.traffic.recent_bandwidth()),
            "traffic": [
                {
                    "op": op,
                    "size_class": size,
                    "count": s.count,
                    "duration_s": s.duration_s,
                    "payload_bytes": s.payload_bytes,
                    "bus_bytes": s.bus_bytes,
                    "buckets": s.buckets.tolist(),
                }
                for (op, size), s in sorted(job.traffic.series.items())
            ],
        }


def _sum_dicts(*parts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0) + v
    return out
