"""State records of a simulated process (comm, progress, clock, stats), in the
plugin's format, written every interval from what the op timeline says was
enqueued, started and completed by then."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from rankwatch import __version__
from rankwatch.simulate.clocks import ClockModel
from rankwatch.simulate.records import NCHANNELS, RankContext
from rankwatch.simulate.timeline import Chunk
from rankwatch.simulate.topology import Layout, Phase

COLL_FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
MAX_LISTED = 64
SLOTS_TOTAL = 65536


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


@dataclass
class CommOps:
    """One rank's ops on one communicator within a chunk, in issue order (true ns)."""

    arrival: np.ndarray
    enq_end: np.ndarray
    gpu_start: np.ndarray
    end: np.ndarray  # +inf when the op never completes
    func: list[str]
    seq: np.ndarray
    peer: list[int | None]
    positions: dict[str, np.ndarray] = field(default_factory=dict)  # func -> op indices
    done_by: np.ndarray = field(default_factory=lambda: np.empty(0))  # running max of end

    def __post_init__(self) -> None:
        names = np.array(self.func, dtype=object)
        for f in set(self.func):
            self.positions[f] = np.flatnonzero(names == f)
        self.done_by = np.maximum.accumulate(self.end) if len(self.end) else self.end

    def completed_by(self, t: float) -> int:
        """Ops completed by time t (all earlier ops done too: stream order)."""
        return int(np.searchsorted(self.done_by, t, side="right"))


@dataclass
class CommState:
    """Counters carried from chunk to chunk for one (rank, communicator)."""

    seqs: dict[str, list[int]] = field(
        default_factory=lambda: {f: [-1, -1, -1] for f in COLL_FUNCS}
    )
    p2p: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    last_activity: float = 0.0


def comm_ops(ctx: RankContext, chunk: Chunk, phases: list[Phase], kind: str) -> CommOps:
    """Gather the rank's ops on communicator kind `kind` from a chunk."""
    cols: dict[str, list] = {k: [] for k in ("a", "q", "s", "e", "f", "n", "p")}
    steps = chunk.first_step + np.arange(chunk.steps)
    for slot in ctx.slots:
        phase = phases[slot.phase_index]
        if phase.comm != kind:
            continue
        pt = chunk.phases[slot.phase_index]
        end = (pt.recv_end if slot.part == "recv" else pt.end)[: chunk.steps, ctx.rank]
        cols["a"].append(pt.api_start[: chunk.steps, ctx.rank])
        cols["q"].append(pt.enq_end[: chunk.steps, ctx.rank])
        cols["s"].append(pt.gpu_start[: chunk.steps, ctx.rank])
        cols["e"].append(np.where(np.isnan(end), np.inf, end))
        cols["n"].append(steps * slot.seq_per_step + slot.seq_in_step)
        cols["f"].append(slot.func)
        cols["p"].append(slot.peer)
    if not cols["a"]:
        empty = np.empty(0)
        return CommOps(empty, empty, empty, empty, [], np.empty(0, dtype=np.int64), [])

    def flat(key: str) -> np.ndarray:
        return np.stack(cols[key], axis=1).reshape(-1)

    return CommOps(
        flat("a"),
        flat("q"),
        flat("s"),
        flat("e"),
        cols["f"] * chunk.steps,
        flat("n"),
        cols["p"] * chunk.steps,
    )


@dataclass
class Snapshot:
    """A communicator's progress at one instant, in true time."""

    seqs: dict[str, list[int]]
    p2p: list[int]
    last_activity: float
    in_flight: list[int]  # op indices, oldest first
    in_flight_count: int


def snapshot(ops: CommOps, carried: CommState, t: float) -> Snapshot:
    """Progress at time t from the carried counters plus this chunk's ops."""
    n_enq = int(np.searchsorted(ops.arrival, t, side="right"))
    n_start = int(np.searchsorted(ops.gpu_start, t, side="right"))
    done_by = ops.done_by
    n_done = ops.completed_by(t)
    seqs = {f: list(v) for f, v in carried.seqs.items()}
    p2p = list(carried.p2p)
    for f, pos in ops.positions.items():
        for which, n in enumerate((n_enq, n_start, n_done)):
            k = int(np.searchsorted(pos, n))
            if f in seqs and k:
                seqs[f][which] = int(ops.seq[pos[k - 1]])
            elif f not in seqs and which != 1:
                p2p[(0 if f == "Send" else 2) + (which == 2)] += k
    times = [carried.last_activity]
    for n, arr in ((n_enq, ops.arrival), (n_start, ops.gpu_start), (n_done, done_by)):
        if n:
            times.append(float(arr[n - 1]))
    pending = [i for i in range(n_done, n_enq) if ops.end[i] > t]
    return Snapshot(seqs, p2p, max(times), pending[:MAX_LISTED], len(pending))


def _in_flight_entry(ops: CommOps, i: int, t: float, local) -> dict:
    if ops.enq_end[i] > t:
        state = "enqueuing"
    elif np.isnan(ops.gpu_start[i]) or ops.gpu_start[i] > t:
        state = "enqueued"
    else:
        state = "gpu_started"
    coll = ops.func[i] in COLL_FUNCS
    channels = (NCHANNELS if coll else 1) if state == "gpu_started" else 0
    arrival = local(ops.arrival[i])
    return {
        "kind": "coll" if coll else "p2p",
        "func": ops.func[i],
        "seq": int(ops.seq[i]),
        "peer": None if coll else ops.peer[i],
        "state": state,
        "arrival_ns": arrival,
        "age_ns": local(t) - arrival,
        "channels_started": channels,
        "channels_stopped": 0,
    }


class RankState:
    """Writes one process's state records as its op timeline unfolds, chunk by chunk."""

    def __init__(
        self,
        ctx: RankContext,
        layout: Layout,
        phases: list[Phase],
        clocks: ClockModel,
        tick_phase_ns: float,
    ) -> None:
        self.ctx, self.layout, self.phases, self.clocks = ctx, layout, phases, clocks
        self.kinds = [k for k in ("world", "tp", "dp", "pp") if k in layout.comms]
        self.carried = {k: CommState(last_activity=self.init_time) for k in self.kinds}
        self.interval = layout.cfg.interval_ms * 1e6
        self.next_tick = self.init_time + tick_phase_ns
        self.totals = [0, 0, 0]  # ops started, records written, bytes written
        self.host = layout.hostnames[ctx.host]
        self._offset = float(clocks.host_offset_ns[ctx.host])
        self._drift = float(clocks.host_drift_ppm[ctx.host]) * 1e-6
        self.counts: dict[str, int] = {}

    def _emit(self, rec: dict) -> bytes:
        self.counts[rec["kind"]] = self.counts.get(rec["kind"], 0) + 1
        return _dumps(rec)

    @property
    def init_time(self) -> float:
        return -1.5e9 + self.ctx.rank * 1e5  # communicators are set up before training

    def local(self, t: float) -> int:
        """This host's wall clock (absolute ns) at true time t."""
        return self.clocks.start_ns + round(t + self._offset + self._drift * t)

    def _head(self, kind: str, t: float) -> dict:
        return {
            "schema": 1,
            "kind": kind,
            "ts_ns": self.local(t),
            "hostname": self.host,
            "pid": int(self.layout.pids[self.ctx.rank]),
        }

    def _comm_head(self, kind: str, comm_kind: str, t: float) -> dict:
        comm = self.layout.comm_of(comm_kind, self.ctx.rank)
        head = self._head(kind, t)
        head.update(
            comm_id=comm.id_str,
            rank=int(self.layout.comm_rank[comm_kind][self.ctx.rank]),
            n_ranks=len(comm.ranks),
        )
        return head

    def comm_records(self) -> bytes:
        out = []
        for i, kind in enumerate(self.kinds):
            comm = self.layout.comm_of(kind, self.ctx.rank)
            rec = self._head("comm", self.init_time + i * 1e6)
            rec.update(
                job_id=self.layout.cfg.job_id,
                comm_id=comm.id_str,
                comm_name=comm.name,
                rank=int(self.layout.comm_rank[kind][self.ctx.rank]),
                n_ranks=len(comm.ranks),
                nnodes=comm.nnodes,
                device=self.ctx.rank % 8,
                abi_version=6,
                plugin_version=__version__,
                gpu_timing="on",
            )
            out.append(self._emit(rec))
        return b"".join(out)

    def progress_record(
        self, kind: str, ops: CommOps, snap: Snapshot, t: float, reason: str
    ) -> bytes:
        rec = self._comm_head("progress", kind, t)
        rec["reason"] = reason
        names = ("enqueued", "started", "completed")
        rec["colls"] = {f: dict(zip(names, snap.seqs[f], strict=True)) for f in COLL_FUNCS}
        rec["p2p"] = dict(
            zip(
                ("send_enqueued", "send_completed", "recv_enqueued", "recv_completed"),
                snap.p2p,
                strict=True,
            )
        )
        rec["last_activity_ns"] = self.local(snap.last_activity)
        rec["in_flight_count"] = snap.in_flight_count
        rec["in_flight"] = [_in_flight_entry(ops, i, t, self.local) for i in snap.in_flight]
        return self._emit(rec)

    def clock_record(self, kind: str, t: float, samples: int) -> bytes:
        rank = self.ctx.rank
        offset = int(self.clocks.gpu_offset_ns[rank] + self.clocks.gpu_est_error_ns[rank])
        error = int(self.clocks.gpu_error_ns[rank])
        rec = self._comm_head("clock", kind, t)
        rec.update(
            offset_ns=offset,
            error_ns=error,
            lower_ns=offset - error,
            upper_ns=offset + error,
            samples=samples,
            window_start_ns=self.local(t - self.interval),
        )
        return self._emit(rec)

    def stats_record(self, t: float, reason: str, in_use: int) -> bytes:
        rec = self._head("stats", t)
        rec.update(
            reason=reason,
            slots_total=SLOTS_TOTAL,
            slots_in_use=in_use,
            ops_started=self.totals[0],
            records_written=self.totals[1],
            dropped_pool_full=0,
            filtered_min_size=0,
            stale_handles=0,
            write_errors=0,
            bytes_written=self.totals[2],
            stream_sent_records=0,  # simulated jobs stream to no collector
            stream_dropped_records=0,
            stream_sent_bytes=0,
            stream_reconnects=0,
        )
        return self._emit(rec)

    def _tick(self, ops: dict[str, CommOps], t: float, reason: str) -> bytes:
        out, in_use, started, done = [], 0, 0, 0
        for kind in self.kinds:
            snap = snapshot(ops[kind], self.carried[kind], t)
            out.append(self.progress_record(kind, ops[kind], snap, t, reason))
            samples = ops[kind].completed_by(t) - ops[kind].completed_by(t - self.interval)
            out.append(self.clock_record(kind, t, samples * NCHANNELS))
            in_use += snap.in_flight_count
            started += int(np.searchsorted(ops[kind].arrival, t, side="right"))
            done += ops[kind].completed_by(t)
        body = b"".join(out)
        self.totals[0] = self._base[0] + started
        self.totals[1] = self._base[1] + done
        self.totals[2] += len(body) + 1180 * max(0, done - self._last_done)
        self._last_done = done
        return body + self.stats_record(t, reason, in_use)

    def chunk_records(self, chunk: Chunk, until: float | None = None) -> bytes:
        """Records of every interval that falls inside this chunk (or before `until`)."""
        ops = {k: comm_ops(self.ctx, chunk, self.phases, k) for k in self.kinds}
        self._base, self._last_done = list(self.totals[:2]), 0
        end = chunk.end_time if until is None else until
        out = []
        while self.next_tick < end:
            out.append(self._tick(ops, self.next_tick, "interval"))
            self.next_tick += self.interval
        for kind in self.kinds:  # carry the counters to the chunk's end
            snap = snapshot(ops[kind], self.carried[kind], end)
            self.carried[kind] = CommState(snap.seqs, snap.p2p, snap.last_activity)
        self.totals[0] = self._base[0] + sum(
            int(np.isfinite(o.arrival).sum()) for o in ops.values()
        )
        self.totals[1] = self._base[1] + sum(int(np.isfinite(o.end).sum()) for o in ops.values())
        return b"".join(out)

    def final_records(self, t: float) -> bytes:
        """Teardown: each communicator's last progress and clock, then exit stats."""
        ops = {
            k: CommOps(*(np.empty(0),) * 4, [], np.empty(0, dtype=np.int64), []) for k in self.kinds
        }
        self._base, self._last_done = list(self.totals[:2]), 0
        out = []
        for kind in self.kinds:
            snap = snapshot(ops[kind], self.carried[kind], t)
            out.append(self.progress_record(kind, ops[kind], snap, t, "finalize"))
            out.append(self.clock_record(kind, t, 0))
        return b"".join(out) + self.stats_record(t + 1e5, "exit", 0)
