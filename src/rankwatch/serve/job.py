"""One job, live: its records in a private DuckDB connection laid out as the store,
the detectors streaming over them, lateness and traffic for the page and metrics.

Phases:
  warming  records are held (in the job's tables) until the topology settles:
           every communicator seen has all its ranks (from `comm` state records or
           op record headers), nothing new appeared for `settle_s`, and, across
           hosts, enough collectives were seen to align the clocks; or `max_warm_s`
           passed. Then the held records are aligned exactly as `rankwatch analyze`
           aligns a run (rankwatch.align.align), the detectors' Topology is built
           from them, and they are replayed through a detect.Stream.
  live     each batch replaces the tables' contents and streams through the same
           SQL (rankwatch.detect.source) into the same Stream. A communicator,
           process or P2P use that the topology lacks makes the job rebuild, after
           `settle_s`: align again over the rolling window of recent records, a
           new Stream, the window replayed. Once the window no longer holds the
           whole job, the old Stream's findings are kept too, judged (as every
           Stream's) against the whole job's span so far, the way `rankwatch
           analyze` judges the stored records.
  ended    every process exited (`exit_grace_s` ago), or its streams closed
           `end_grace_s` ago, or no record came for `idle_end_s`: the Stream is
           closed (as at the end of stored records) and its final findings kept;
           the connection is freed.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rankwatch.detect import Config, Stream, Topology
from rankwatch.detect.hang import HangDetector
from rankwatch.detect.robust import nanmax, nanmin
from rankwatch.detect.source import read_ops, read_progress
from rankwatch.detect.topology import comm_key
from rankwatch.model import BASE_TABLES, Finding, Run
from rankwatch.serve.convert import arrow_table
from rankwatch.serve.lateness import Lateness
from rankwatch.serve.traffic import Traffic
from rankwatch.store import tables
from rankwatch.store.engine import EngineSettings, configure
from rankwatch.store.ingest import timed

PROC = tuple[str, int]
WINDOW_TABLES = ("ops", "progress")  # what a rebuild replays


@dataclass(frozen=True)
class JobConfig:
    settle_s: float = 1.0
    max_warm_s: float = 10.0
    max_held_ops: int = 500_000
    clock_collectives: int = 32  # collectives across hosts before clocks are aligned
    window_ops: int = 100_000  # recent op records kept (as Arrow) for a rebuild
    end_grace_s: float = 10.0
    exit_grace_s: float = 1.0
    idle_end_s: float = 60.0
    detect: Config | None = None
    memory_limit: str = "256MB"  # DuckDB, per job


@dataclass
class Proc:
    host: str
    pid: int
    rank: int | None = None  # world rank
    device: int | None = None
    records: int = 0
    last_wall: float = 0.0
    exited: bool = False
    streams_open: int = 0
    streamed: bool = False
    connection: int = 0  # the plugin's count of its connections (1: never reconnected)
    dropped_pool_full: int = 0
    dropped_stream: int = 0


@dataclass
class Comm:
    n_ranks: int
    name: str | None = None
    ranks: dict[int, PROC] = field(default_factory=dict)  # rank -> process


def finding_key(f: Finding) -> tuple:
    """What makes a finding the same one as a batch later (for alerts and merging)."""
    op = (f.evidence or {}).get("op") or {}
    comm = f.comm.id if f.comm is not None else None
    return (f.kind, f.rank, f.cause, comm, op.get("func"), op.get("seq"))


class LiveJob:
    """See module doc."""

    def __init__(self, key: str, job_id: str, cfg: JobConfig, wall: float) -> None:
        import duckdb

        self.key, self.job_id, self.cfg = key, job_id, cfg
        self.con = duckdb.connect()
        base = EngineSettings.from_env()
        configure(self.con, EngineSettings(cfg.memory_limit, base.spill_parent, base.threads))
        tables.create_all(self.con)
        self.run = Run(self.con, {t: t for t in BASE_TABLES}, {}, [])
        self.phase = "warming"
        self.first_wall, self.last_wall, self.changed_wall = wall, wall, wall
        self.ended_wall: float | None = None
        self.topo: Topology | None = None
        self.stream: Stream | None = None
        self.retired: list[Stream] = []  # Streams that rebuilds replaced
        self.carried: list[Finding] = []  # the hang fast lane's, at a rebuild
        self.rebuild_at: float | None = None
        self.rebuilds = 0
        self.procs: dict[PROC, Proc] = {}
        self.comms: dict[str, Comm] = {}
        self.p2p: set[str] = set()
        self.members: set[PROC] = set()  # processes seen in a communicator
        self.held_ops = 0
        self.monitor_dropped = 0  # records the monitor shed while this job was running
        self.records = {"op": 0, "state": 0}
        self.last_progress_ns: int | None = None
        self.traffic = Traffic()
        self.window: deque[tuple[str, pa.Table]] = deque()  # recent batches, oldest first
        self.window_rows = 0
        self.window_whole = True  # the window still holds every op and progress record
        self.lateness = Lateness()
        self.batches = 0
        self.error: str | None = None
        self.timings: dict[str, float] = {}  # seconds per processing stage (shared by the state)
        self._registered = False  # the topology's id tables are in the connection
        self._empty: dict[str, pa.Table] = {}  # schemas of ops and progress, once live
        self.early: Stream | None = None  # the hang fast lane: HangDetector only
        # the plugin's stream counters, when its stats records carry them
        cols = {c for c, _ in tables.STATE_TABLE_COLUMNS["stats"]}
        self._stream_stats = "stream_dropped_records" in cols

    # ------------------------------------------------------------------ input
    def add(self, batch: dict[str, pa.Table], wall: float) -> None:
        """Fold one batch of the job's rows (per store table) in."""
        if self.phase == "ended":
            return
        self.batches += 1
        self.last_wall = wall
        for name, table in batch.items():
            self.con.register("rw_in", table)
            try:
                with timed(self.timings, "observe"):
                    self._observe(name, wall)
                # held while warming; comm records are kept for every rebuild; in the live
                # phase the batch is read where it is (below), never copied
                if self.phase == "warming" or name == "comms":
                    with timed(self.timings, "insert"):
                        self.con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM rw_in")
            finally:
                self.con.unregister("rw_in")
        if self.phase == "warming":
            self.held_ops += batch["ops"].num_rows if "ops" in batch else 0
            if self._ready(wall):
                self._start()
            return
        self._remember(batch)
        if self.rebuild_at is not None and wall >= self.rebuild_at:
            self._rebuild()
            return
        self._scan(batch)
        try:
            self._feed(lateness=True)
        finally:
            self._unscan()

    def early_progress(self, progress: pa.Table) -> None:
        """Progress records ahead of the op backlog into the hang fast lane: the same
        HangDetector on the same columns, with the main Stream's op latency (its hang
        threshold) so both judge alike. Its hangs show until the main Stream has them."""
        if self.phase != "live" or self.early is None or self.stream is None:
            return
        self.early.ctx.max_latency_ns = self.stream.ctx.max_latency_ns
        self.con.register("progress", progress)
        try:
            prog = read_progress(self.run, self.topo, register=False)
        finally:
            self.con.unregister("progress")
        if len(prog):
            self.early.feed(None, prog)

    def source_opened(self, proc: PROC, wall: float, dropped: int, connection: int = 1) -> None:
        p = self._proc(proc, wall)
        p.streams_open += 1
        p.streamed = True
        p.connection = max(p.connection, connection)
        p.dropped_stream = max(p.dropped_stream, dropped)

    def source_closed(self, proc: PROC, wall: float) -> None:
        p = self._proc(proc, wall)
        p.streams_open = max(0, p.streams_open - 1)
        p.last_wall = wall

    def tick(self, wall: float) -> None:
        """Time-driven steps: start, rebuild, end (batches may stop coming)."""
        if self.phase == "ended":
            return
        if self.phase == "warming" and self._ready(wall):
            self._start()
        if self.phase == "live" and self.rebuild_at is not None and wall >= self.rebuild_at:
            self._rebuild()
        if self._ended(wall):
            self.finish(wall)

    def finish(self, wall: float) -> None:
        """The job ended: close the Stream (final findings) and free the tables."""
        if self.phase == "ended":
            return
        if self.phase == "warming" and self.procs:
            self._start(force=True)
        if self.stream is not None:
            self.stream.close()
        self.early = None
        if self.phase == "live":  # the shared SQL reads these names; the batch is gone
            self._scan({})
        self.lateness.flush(self.con)
        self.phase, self.ended_wall = "ended", wall
        self.con.close()

    # ------------------------------------------------------------------ views
    def findings(self) -> list[Finding]:
        """Current findings (final ones once ended), with those of the Streams that
        rebuilds replaced. Each Stream's are judged against the whole job's span so
        far: a slowdown costly against the seconds before a rebuild may be noise
        against the whole job, as `rankwatch analyze` of the files would judge it."""
        streams = self.retired + ([self.stream] if self.stream is not None else [])
        spans = np.array([s.span_ns for s in streams]).reshape(-1, 2)
        first, last = nanmin(spans[:, 0]), nanmax(spans[:, 1])
        judged = [s.findings_over(first - s.topo.t0_ns, last - s.topo.t0_ns) for s in streams]
        current = judged.pop() if self.stream is not None else []
        # hangs the main Stream has not reached yet (the fast lane's)
        early = self.early.findings() if self.early is not None else []
        seen = {finding_key(f) for f in current}
        out = list(current)
        for f in [f for old in reversed(judged) for f in old] + early + self.carried:
            if finding_key(f) not in seen:
                seen.add(finding_key(f))
                out.append(f)
        return out

    @property
    def stream_gaps(self) -> int:
        """Records missing from the live view that the files have: shed by the plugin's
        stream queue or by an overloaded monitor. A gap in one rank's records looks like a
        desync to the detectors, so desyncs are not alerted while there are gaps."""
        return self.monitor_dropped + sum(p.dropped_stream for p in self.procs.values())

    @property
    def total_cost_s(self) -> float:
        return self.stream.total_cost_s if self.stream is not None else 0.0

    # ------------------------------------------------------------------ learning
    def _proc(self, proc: PROC, wall: float) -> Proc:
        p = self.procs.get(proc)
        if p is None:
            p = self.procs[proc] = Proc(proc[0], int(proc[1]), last_wall=wall)
            self.changed_wall = wall
        return p

    def _observe(self, table: str, wall: float) -> None:
        """Learn processes, communicators, ranks and exits from the rows in rw_in (one
        query per table: rows grouped by process and communicator slot)."""
        kind = "op" if table == "ops" else "state"
        if table in ("ops", "comms"):
            self._observe_members(table, kind, wall)
            if table == "ops":
                self.traffic.add(self.con, "rw_in", wall)
            return
        ts = "NULL" if table == "clock" else "max(ts_ns)"
        exited = "false" if table == "clock" else "bool_or(reason = 'exit')"
        pool = "max(dropped_pool_full)" if table == "stats" else "NULL"
        stream = (
            "max(stream_dropped_records)" if table == "stats" and self._stream_stats else "NULL"
        )
        rows = self.con.execute(
            f"SELECT host, pid, count(*), {ts}, {exited}, {pool}, {stream} "
            "FROM rw_in GROUP BY host, pid"
        ).fetchall()
        for host, pid, n, newest, gone, pool_full, stream_dropped in rows:
            p = self._seen((host, pid), kind, int(n), wall)
            p.exited = p.exited or bool(gone)
            if pool_full is not None:
                p.dropped_pool_full = max(p.dropped_pool_full, int(pool_full))
            if stream_dropped is not None:
                p.dropped_stream = max(p.dropped_stream, int(stream_dropped))
            if table == "progress" and newest is not None:
                self.last_progress_ns = max(self.last_progress_ns or 0, int(newest))

    def _observe_members(self, table: str, kind: str, wall: float) -> None:
        p2p = "bool_or(kind = 'p2p')" if table == "ops" else "false"
        device = "max(device)" if table == "comms" else "NULL"
        rows = self.con.execute(
            f"SELECT host, pid, comm_id, max(comm_name), max(n_ranks), rank, {p2p}, {device}, "
            "count(*) FROM rw_in GROUP BY host, pid, comm_id, rank"
        ).fetchall()
        for host, pid, comm_id, name, n_ranks, rank, is_p2p, dev, n in rows:
            p = self._seen((host, pid), kind, int(n), wall)
            if dev is not None:
                p.device = int(dev)
            if comm_id is None or rank is None:
                continue
            key = comm_key(comm_id)
            self._member(key, name, int(n_ranks or 0), int(rank), (host, pid), wall)
            if is_p2p and key not in self.p2p:
                self.p2p.add(key)
                self._changed(wall, new_comm=key)
        self._world_ranks()

    def _seen(self, proc: PROC, kind: str, n: int, wall: float) -> Proc:
        p = self._proc(proc, wall)
        p.records += n
        p.last_wall = wall
        self.records[kind] += n
        return p

    def _member(
        self, key: str, name: str | None, n_ranks: int, rank: int, proc: PROC, wall: float
    ) -> None:
        c = self.comms.get(key)
        if c is None:
            c = self.comms[key] = Comm(n_ranks, name)
            self._changed(wall, new_comm=key)
        if c.ranks.get(rank) != proc:
            c.ranks[rank] = proc
            c.n_ranks = max(c.n_ranks, n_ranks)
            self._changed(wall, new_member=(key, rank))
        if proc not in self.members:
            self.members.add(proc)
            self._changed(wall)

    def _changed(
        self, wall: float, new_comm: str | None = None, new_member: tuple[str, int] | None = None
    ) -> None:
        """The topology grew: wait to settle (warming) or schedule a rebuild (live)."""
        self.changed_wall = wall
        if self.phase == "live" and self._topology_lacks(new_comm, new_member):
            self.rebuild_at = wall + self.cfg.settle_s

    def _topology_lacks(self, comm: str | None, member: tuple[str, int] | None = None) -> bool:
        t = self.topo
        if t is None:
            return True
        if any(k not in t.proc_of_key for k in self.members):
            return True
        if member is not None:  # a rank of a communicator (a known process may hold several)
            i = t.comm_of_key.get(member[0])
            if i is None or member[1] >= len(t.members[i]) or t.members[i][member[1]] < 0:
                return True
        if comm is not None:
            i = t.comm_of_key.get(comm)
            return i is None or (comm in self.p2p and i not in t.p2p_comms)
        return any(
            (i := t.comm_of_key.get(k)) is None or len(c.ranks) > int(t.comm_size[i])
            for k, c in self.comms.items()
        )

    def rank_rows(self) -> list[tuple[int | None, Proc, int | None, bool]]:
        """(world rank, its process, its device, whether it is the process's first
        rank) of every rank: per rank of the topology once there is one (a process
        may hold several), else per process."""
        if self.topo is None:
            return [(p.rank, p, p.device, True) for p in self.procs.values()]
        topo, rows = self.topo, []
        for i, t in enumerate(topo.procs):
            p = self.procs.get((t.host, t.pid))
            if p is not None:
                device = t.device if t.multi_rank else p.device
                rows.append((t.world_rank, p, device, topo.proc_of_key[(t.host, t.pid)] == i))
        rows += [(p.rank, p, p.device, True) for k, p in self.procs.items()
                 if k not in topo.proc_of_key]  # fmt: skip
        return rows

    def _world_ranks(self) -> None:
        """Ranks in the largest communicator (the world), until the topology says."""
        if self.topo is not None or not self.comms:
            return
        world = max(self.comms, key=lambda k: (self.comms[k].n_ranks, k))
        # a process holding several ranks: its first (smallest, assigned last)
        for rank, proc in sorted(self.comms[world].ranks.items(), reverse=True):
            self.procs[proc].rank = rank

    # ------------------------------------------------------------------ phases
    def _settled(self) -> bool:
        return bool(self.comms) and all(len(c.ranks) >= c.n_ranks for c in self.comms.values())

    def _ready(self, wall: float) -> bool:
        if not self.held_ops:
            return False
        if wall - self.first_wall >= self.cfg.max_warm_s or self.held_ops >= self.cfg.max_held_ops:
            return True
        if not self._settled() or wall - self.changed_wall < self.cfg.settle_s:
            return False
        hosts = {h for h, _ in self.procs}
        return len(hosts) <= 1 or self.held_ops >= self.cfg.clock_collectives * len(self.procs)

    def _start(self, force: bool = False, lateness: bool = True) -> None:
        """Align the held records, build the topology and the Stream, replay them."""
        if not force and not self.held_ops:
            return
        align_for_detection(self.run)
        self.topo = Topology.from_run(self.run)
        for key, p in self.procs.items():  # a process holding several ranks: its first
            i = self.topo.proc_of_key.get(key)
            if i is not None:
                p.rank = self.topo.procs[i].world_rank
        self.stream = Stream(self.topo, self.cfg.detect)
        self.early = Stream(self.topo, self.cfg.detect, detectors=[HangDetector])
        self.phase, self.rebuild_at = "live", None
        self._registered = False
        held = {t: arrow_table(self.con.sql(f"SELECT * FROM {t}")) for t in WINDOW_TABLES}
        self._feed(lateness=lateness)
        self._remember(held)
        self.held_ops = 0
        # From now on each batch is scanned in place: the shared SQL reads `ops` and
        # `progress`, which become the batch's Arrow tables (see _scan).
        self._empty = {t: held[t].schema.empty_table() for t in WINDOW_TABLES}
        for t in WINDOW_TABLES:
            self.con.execute(f"DROP TABLE {t}")
        for t in ("clock", "stats"):
            self.con.execute(f"DELETE FROM {t}")

    def _rebuild(self) -> None:
        """Topology grew: realign over the window, new Stream, replay (see module doc)."""
        # The new Stream replays the window; while that is the whole job, the old
        # Stream's findings are the new one's to make (keeping both would count one
        # slowdown twice, and judge it on fewer records than `rankwatch analyze` does).
        if self.stream is not None and not self.window_whole:
            self.stream.retire()
            self.retired.append(self.stream)
        if self.early is not None:
            self.carried += self.early.findings()
        for t in WINDOW_TABLES:
            self.con.execute(tables.create_sql(t, _columns(t)))
        while self.window:  # the window holds the batch too
            name, table = self.window.popleft()
            self.con.register("rw_in", table)
            try:
                self.con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM rw_in")
            finally:
                self.con.unregister("rw_in")
        self.window_rows = 0
        self.rebuilds += 1
        self.topo, self.stream = None, None
        self._start(force=True, lateness=False)

    def _feed(self, lateness: bool) -> None:
        """Stream the rows of `ops` and `progress` to the detectors (and lateness)."""
        assert self.stream is not None and self.topo is not None
        with timed(self.timings, "detect"):
            feed_run(self.stream, self.run, self.topo, register=not self._registered)
        self._registered = True
        if lateness:
            with timed(self.timings, "lateness"):
                self.lateness.add(self.con)

    def _scan(self, batch: dict[str, pa.Table]) -> None:
        for t in WINDOW_TABLES:
            self.con.register(t, batch.get(t, self._empty[t]))

    def _unscan(self) -> None:
        for t in WINDOW_TABLES:
            self.con.unregister(t)

    def _remember(self, batch: dict[str, pa.Table]) -> None:
        """Keep the newest op and progress rows (bounded) for a rebuild to replay."""
        for name in WINDOW_TABLES:
            table = batch.get(name)
            if table is not None and table.num_rows:
                self.window.append((name, table))
                self.window_rows += table.num_rows
        while self.window and self.window_rows > self.cfg.window_ops:
            _, old = self.window.popleft()
            self.window_rows -= old.num_rows
            self.window_whole = False

    def _ended(self, wall: float) -> bool:
        procs = list(self.procs.values())
        if not procs:
            return False
        quiet = wall - self.last_wall
        if all(p.exited for p in procs):  # a file's last lines may still be on their way
            return quiet >= self.cfg.exit_grace_s
        closed = all(p.streamed and not p.streams_open for p in procs)
        return (closed and quiet >= self.cfg.end_grace_s) or quiet >= self.cfg.idle_end_s


def _columns(table: str) -> list[tuple[str, str]]:
    if table == "ops":
        return [(c, t) for c, t, _, _ in tables.OP_COLUMNS]
    return tables.STATE_TABLE_COLUMNS[table]


def align_for_detection(run: Run) -> None:
    """What the detectors need of rankwatch.align.align, with the same SQL: ranks,
    host clocks and the ops_aligned view (not the per-collective summary tables,
    which only reports read)."""
    from rankwatch.align.clock import estimate_clocks
    from rankwatch.align.collectives import OPS_ALIGNED_SQL
    from rankwatch.align.ranks import map_ranks

    map_ranks(run)
    estimate_clocks(run)
    run.con.execute(OPS_ALIGNED_SQL)
    run.tables["ops_aligned"] = "ops_aligned"


def feed_run(stream: Stream, run: Run, topo: Topology, register: bool = True) -> int:
    """Stream the op and progress records in the run's tables, as detect() does for a
    stored run: ops by GPU end, each batch with the progress written up to it."""
    prog = read_progress(run, topo, register=register)
    i, fed = 0, 0
    now = stream.now
    for ops in read_ops(run, topo, register=False):
        end = np.where(np.isnan(ops.gend_c), ops.arrival_c, ops.gend_c)
        now = max(now, nanmax(end))
        j = int(np.searchsorted(prog.ts, now, side="right"))
        stream.feed(ops, prog.take(np.arange(i, j)) if j > i else None, now)
        i, fed = j, fed + len(ops)
    if i < len(prog):
        stream.feed(None, prog.take(np.arange(i, len(prog))))
    return fed


def clean_number(x: Any) -> Any:
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    return clean_number(obj)


def findings_dicts(findings: Iterable[Finding]) -> list[dict]:
    return [jsonable(f.to_dict()) for f in findings]
