"""Per-record columns every detector needs, computed once as records stream in.

Clock-free local segments (same process, same clock):
  e_prev   the end of the process's previous op: the latest GPU end among its
           last few ops that arrived before this one and ended before this one's
           GPU start (ops on overlapping streams are skipped);
  gap_g    gstart - e_prev: what the GPU did between the two ops (compute, waiting
           for the launch). A straggler's own extra work shows here; a victim's
           inherited lateness does not (it waited inside the previous op).
  gap_h    arrival - e_prev: when the host called, relative to the same point
           (negative while the host runs ahead of the GPU). It moves with gap_g
           when the host is the cause and stays put when the GPU is.
  dur      gend - gstart.
Cohort keys: a class cohort is one op position (class, function, seq; for P2P
class, sender, receiver, seq) over all communicators of a class, and an
instance is its part on one communicator (`uid`). `op_index` counts a
process's collectives on a communicator in issue order, which seq cannot (seq is
per function); an op that arrives in a later batch than one issued after it
shifts it by one for a moment, which desync.py tolerates. A record that comes
much later (the plugin writes an op whose channel events never came only once a
later op has finished, seconds on) is inferred from the gap it leaves in its
function's sequence numbers: the next op of that function counts it, and the late
record itself gets no index (-1), so a rank is never a whole stretch of ops behind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from rankwatch.detect import kernels
from rankwatch.detect.columns import OpColumns
from rankwatch.detect.records import Recs
from rankwatch.detect.robust import run_heads, run_tails, stable_order
from rankwatch.detect.topology import FUNCS, RECV, SEND, Topology

STALE_SLACK_NS = 2000.0  # clock jitter allowed between one op's end and the next's start
LOOKBACK = 3  # previous ops of a process considered for e_prev (a Send/Recv pair is 2)
SEQ_BITS = 40
MIX = np.uint64(0x9E3779B97F4A7C15)


def cohort_keys(cls: np.ndarray, func: np.ndarray, seq: np.ndarray, sender, receiver) -> np.ndarray:
    p2p = (func == SEND) | (func == RECV)
    code = cls * 8 + np.where(p2p, SEND, func)
    coll_payload = seq & ((1 << SEQ_BITS) - 1)
    p2p_payload = ((sender & 0xFFF) << 28) | ((receiver & 0xFFF) << 16) | (seq & 0xFFFF)
    return (code << SEQ_BITS) | np.where(p2p, p2p_payload, coll_payload)


def instance_uid(key: np.ndarray, comm: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        u = key.astype(np.uint64) * MIX + comm.astype(np.uint64)
    return u.view(np.int64)


# columns the detectors read, and the narrower types they are kept in
_I32 = np.int32
KEEP: dict[str, type | None] = {
    "proc": _I32,
    "comm": _I32,
    "rank": _I32,
    "func": _I32,
    "seq": None,
    "peer": _I32,
    "msg": None,
    "arrival_c": None,
    "gstart_c": None,
    "gend_c": None,
    "cls": _I32,
    "stage": _I32,
    "p2p": None,
    "key": None,
    "uid": None,
    "sym": None,
    "cslot": None,
    "prev_uid": None,
    "gap_g": None,
    "gap_h": None,
    "dur": None,
    "op_index": None,
}


class Preparer:
    """Adds the columns above to each batch; carries per-process state across batches."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        n = topo.n_procs
        self.carry_arrival = np.full((n, LOOKBACK), np.nan)
        self.carry_gend = np.full((n, LOOKBACK), np.nan)
        self.carry_uid = np.zeros((n, LOOKBACK), dtype=np.int64)
        self.op_count = np.zeros(topo.n_slots, dtype=np.int64)
        # highest seq counted per (comm, rank) slot and function (-1: none yet)
        self.last_seq = np.full((topo.n_slots, len(FUNCS)), -1, dtype=np.int64)
        self.slot_end = np.full(topo.n_slots, np.nan)  # last op's GPU end per (comm, rank)
        self.slot_start = np.full(topo.n_slots, np.nan)

    def __call__(self, ops: OpColumns) -> Recs:
        t = self.topo
        r = Recs({k: getattr(ops, k) for k in ops.__dataclass_fields__})
        derived = kernels.columns(ops, t)
        if derived is not None:
            for name, col in derived.items():
                setattr(r, name, col)
        else:
            self._derive(r, ops)

        # each (communicator, rank)'s ops in stream order: made once, if a NumPy
        # path below needs it (the compiled kernels walk the stream as it is)
        @functools.cache
        def by_slot() -> np.ndarray:
            return stable_order(r.cslot, int(r.cslot.max()) + 1) if len(r) else r.cslot

        self._stale_starts(r, by_slot)
        self._gaps(r)
        self._op_index(r, by_slot)
        return Recs({k: _narrow(getattr(r, k), t) for k, t in KEEP.items()})

    def _derive(self, r: Recs, ops: OpColumns) -> None:
        """Class, stage, cohort key, instance uid, symbol and slot of each record."""
        t = self.topo
        r.cls = t.comm_class[ops.comm]
        r.stage = t.stage[ops.proc]
        p2p = (ops.func == SEND) | (ops.func == RECV)
        r.p2p = p2p
        sender = np.where(ops.func == RECV, ops.peer, ops.rank)
        receiver = np.where(ops.func == RECV, ops.rank, ops.peer)
        r.key = cohort_keys(r.cls, ops.func, ops.seq, sender, receiver)
        r.uid = instance_uid(r.key, ops.comm)
        direction = np.where(p2p, np.where(ops.peer > ops.rank, 1, 2), 0)
        r.sym = (r.cls * 8 + ops.func) * 4 + direction
        r.cslot = t.slot_base[ops.comm] + np.minimum(ops.rank, t.comm_size[ops.comm] - 1)

    def _stale_starts(self, r: Recs, by_slot: Callable[[], np.ndarray]) -> None:
        """Forget GPU starts that belong to an earlier op: NCCL runs a communicator's
        kernels in order, so a start before the previous op's end on the same
        communicator and rank is stale (unless both ran in one kernel and share the
        start), and so is a start after the op's own end. Newer plugins flag these
        themselves; older records and other writers do not."""
        n = len(r)
        if not n:
            return
        stale = kernels.stale_starts(
            r.cslot, r.arrival, r.gstart, r.gend, self.slot_end, self.slot_start
        )
        if stale is None:  # no kernels, or arrivals out of stream order in a slot
            order, stale_sorted = self._stale_sorted(r, by_slot())
            stale = np.zeros(n, dtype=bool)
            stale[order] = stale_sorted
        if stale.any():
            r.gstart, r.gstart_c = r.gstart.copy(), r.gstart_c.copy()
            r.gstart[stale] = np.nan
            r.gstart_c[stale] = np.nan

    def _stale_sorted(self, r: Recs, by_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """_stale_starts in NumPy: (each slot's records in arrival order, whether stale)."""
        arrival = np.nan_to_num(r.arrival, nan=np.inf)
        order = _then_by(by_slot, r.cslot, arrival)
        if order is None:  # arrival order differs from stream order somewhere
            order = np.lexsort((arrival, r.cslot))
        s, gs, ge = r.cslot[order], r.gstart[order], r.gend[order]
        first = run_heads(s)
        prev_end, prev_start = np.r_[np.nan, ge[:-1]], np.r_[np.nan, gs[:-1]]
        prev_end[first], prev_start[first] = self.slot_end[s[first]], self.slot_start[s[first]]
        with np.errstate(invalid="ignore"):
            stale = ((gs + STALE_SLACK_NS < prev_end) & (gs != prev_start)) | (gs > ge)
        last = np.flatnonzero(run_tails(s))
        self.slot_end[s[last]], self.slot_start[s[last]] = ge[last], gs[last]
        return order, stale

    def _gaps(self, r: Recs) -> None:
        got = kernels.gaps(
            r.proc, r.arrival, r.gstart, r.gend, r.uid,
            self.carry_arrival, self.carry_gend, self.carry_uid,
        )  # fmt: skip
        if got is not None:
            r.prev_uid, r.gap_g, r.gap_h, r.dur = got
            return
        n, m = len(r), LOOKBACK
        # each process's ops, in stream order
        order = stable_order(r.proc, int(r.proc.max()) + 1) if n else np.zeros(0, np.int64)
        proc = r.proc[order]
        arr, end, uid = r.arrival[order], r.gend[order], r.uid[order]
        cut = _first_finite(r.gstart, r.arrival)[order]
        idx = np.arange(n)
        first = run_heads(proc)
        start = np.maximum.accumulate(np.where(first, idx, 0))
        q = idx - start  # position among the process's new ops
        best = np.full(n, -np.inf)
        best_uid = np.zeros(n, dtype=np.int64)
        early = np.flatnonzero(q < m)  # a process's first ops here: look back into the carry
        for k in range(1, m + 1):
            # the element k places back (its process's k-th previous op, unless carried)
            p_arr, p_end, p_uid = _back(arr, k), _back(end, k), _back(uid, k)
            carried = early[q[early] < k]  # the k-th previous op came in an earlier batch
            if len(carried):
                pc, c = proc[carried], m - (k - q[carried])
                p_arr[carried] = self.carry_arrival[pc, c]
                p_end[carried] = self.carry_gend[pc, c]
                p_uid[carried] = self.carry_uid[pc, c]
            # the latest end of an op that arrived before this one and ended before it
            # started (ties: the nearer op)
            better = (p_arr < arr) & (p_end <= cut) & (p_end > best)
            best = np.where(better, p_end, best)
            best_uid = np.where(better, p_uid, best_uid)
        e_prev = np.empty(n)
        e_prev[order] = np.where(np.isfinite(best), best, np.nan)
        prev_uid = np.empty(n, dtype=np.int64)
        prev_uid[order] = best_uid
        r.prev_uid = prev_uid
        r.gap_g = r.gstart - e_prev
        r.gap_h = r.arrival - e_prev
        r.dur = r.gend - r.gstart
        self._carry(proc, start, first, arr, end, uid)

    def _carry(self, proc, start, first, arr, end, uid) -> None:
        """Each process's last LOOKBACK ops (oldest first), old ones shifted out."""
        m, n = LOOKBACK, len(proc)
        if not n:
            return
        begins = np.flatnonzero(first)
        ends = np.r_[begins[1:], n]
        p, count = proc[begins], ends - begins
        old = [self.carry_arrival[p].copy(), self.carry_gend[p].copy(), self.carry_uid[p].copy()]
        for t in range(m):
            back = m - 1 - t  # 0: the newest
            new = back < count
            src = np.where(new, ends - 1 - back, 0)
            shifted = np.minimum(t + count, m - 1)
            for dest, mine, before in zip(
                (self.carry_arrival, self.carry_gend, self.carry_uid),
                (arr, end, uid),
                old,
                strict=True,
            ):
                dest[p, t] = np.where(new, mine[src], before[np.arange(len(p)), shifted])

    def _op_index(self, r: Recs, by_slot: Callable[[], np.ndarray]) -> None:
        got = kernels.op_index(
            r.p2p, r.cslot, r.func, r.seq, r.arrival_c, self.last_seq, self.op_count
        )
        if got is not None:
            r.op_index = got
            return
        idx = np.full(len(r), -1, dtype=np.int64)
        coll = np.flatnonzero(~r.p2p)
        if len(coll):
            slots = r.cslot[coll]
            # issue order: ops of one communicator can complete (and arrive) out of order
            t = np.nan_to_num(r.arrival_c[coll], nan=0.0)
            rel = np.clip(t - t.min(), 0, 2.0**40 - 1).astype(np.int64)
            where = np.full(len(r), -1, dtype=np.int64)
            where[coll] = np.arange(len(coll))
            mine = where[by_slot()]
            order = _then_by(mine[mine >= 0], slots, rel >> 17)
            if order is None:
                order = np.argsort((slots.astype(np.int64) << 23) + (rel >> 17), kind="stable")
            s = slots[order]
            missing, late = self._gaps_in_seq(s, r.func[coll][order], r.seq[coll][order])
            step = np.where(late, 0, 1 + missing)  # what each record adds to the count
            first = np.ones(len(s), dtype=bool)
            first[1:] = s[1:] != s[:-1]
            total = np.cumsum(step)
            before = total - step  # counted before each record, from this batch's start
            start = np.maximum.accumulate(np.where(first, np.arange(len(s)), 0))
            within = before - before[start]
            idx[coll[order]] = np.where(late, -1, self.op_count[s] + within + missing)
            heads = np.flatnonzero(first)
            self.op_count[s[heads]] += np.add.reduceat(step, heads)  # ops per slot
        r.op_index = idx

    def _gaps_in_seq(
        self, s: np.ndarray, func: np.ndarray, seq: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For records in issue order per slot: how many ops of the record's function
        its seq says were issued before it and not seen (a gap after the highest seq
        so far), and whether it is such a missing op arriving late (seq below it)."""
        key = s.astype(np.int64) * len(FUNCS) + func
        by_key = np.argsort(key, kind="stable")
        k, q = key[by_key], seq[by_key].astype(np.int64)
        head = run_heads(k)
        gid = np.cumsum(head) - 1
        span = int(q.max()) + 2 if len(q) else 1
        carry = self.last_seq.reshape(-1)[k]
        if (int(gid[-1]) + 1) * span < 2**62:
            # running max within each group: offset groups apart, one accumulate
            run = np.maximum.accumulate(gid * span + q + 1) - gid * span - 1
        else:  # seqs too large to offset: group by group
            run = np.concatenate(
                [np.maximum.accumulate(part) for part in np.split(q, np.flatnonzero(head)[1:])]
            )
        prev = np.where(head, -1, np.r_[-1, run[:-1]])
        prev = np.maximum(prev, carry)  # the highest seq before each record
        known = prev >= 0
        missing = np.where(known, np.maximum(q - prev - 1, 0), 0)
        late = known & (q < prev)
        tails = run_tails(k)
        self.last_seq.reshape(-1)[k[tails]] = np.maximum(run[tails], carry[tails])
        out_missing, out_late = np.empty_like(missing), np.empty_like(late)
        out_missing[by_key], out_late[by_key] = missing, late
        return out_missing, out_late


def _narrow(a: np.ndarray, dtype: type | None) -> np.ndarray:
    """`a` in the type KEEP keeps it in (None: as it is; no copy when it already is)."""
    return a if dtype is None else a.astype(dtype, copy=False)


def _back(a: np.ndarray, k: int) -> np.ndarray:
    """a shifted k places later (a[i - k]; the first k are a[0]): a slice, not a gather."""
    out = np.empty_like(a)
    out[k:] = a[: len(a) - k] if k < len(a) else a[:0]
    out[: min(k, len(a))] = a[0] if len(a) else 0
    return out


def _then_by(by_group: np.ndarray, group: np.ndarray, value: np.ndarray) -> np.ndarray | None:
    """`by_group` (a stable order by group) if it also orders each group by value,
    i.e. the stable sort by (group, value); None when it does not. Records stream in
    by GPU end, which within one process and communicator is almost always their
    issue order: checking is a pass, sorting again a sort."""
    g, v = group[by_group], value[by_group]
    if np.all((v[1:] >= v[:-1]) | (g[1:] != g[:-1])):
        return by_group
    return None


def _first_finite(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(a), a, b)
