"""The step ledger: for every rank and step, the measured step wall time split into
buckets that add up to it exactly (integer nanoseconds).

The step window [s, e) (the rank's step marker) is cut at every boundary of every
interval below, and each piece gets exactly one bucket, by the first rule that
holds for it (so the buckets partition the window; their sum is e - s by
construction, and `check()` verifies it):

GPU ranks (the device timeline: all streams of the rank's GPU):
  overlapped_comm    a communication kernel is transferring (not waiting) while a
                     compute kernel runs: useful overlap
  compute            a compute kernel runs (communication that is only waiting for a
                     peer at the same time is *visual* overlap: reported as
                     visual_overlap_ns, inside compute, not as useful overlap)
  exposed_transfer   communication transferring, no compute
  exposed_wait       communication waiting for the named peer (the collective's last
                     rank to arrive), no compute; split per peer in wait_by_peer
  exposed_comm_unsplit  communication not matched across ranks (transfer and wait
                     cannot be told apart), no compute
  memcpy             only memory copies / sets run
  input_wait         the GPU is idle while a host thread is in a data-loading range
  host_launch_gap    the GPU is idle and the op that ends the idle time had not been
                     launched yet (its launch call had not returned): the host was late
  idle               the GPU is idle although the next op was already launched
                     (device-side dependency or launch latency)
  unclassified       everything else: idle time with no op after it, or whose next
                     op's launch is not in the trace
CPU-only ranks (no GPU events; the host's threads are the timeline):
  exposed_transfer, exposed_wait, exposed_comm_unsplit (host collectives, e.g.
  gloo), then input_wait, then compute (any host operator), then unclassified.

Transfer vs wait of each communication op comes from collectives._split (clock-free).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.explain.collectives import CollectiveTable, CommOp
from rankwatch.explain.events import Kind, RankTrace
from rankwatch.explain.links import Links
from rankwatch.explain.steps import StepTable

BUCKETS: tuple[str, ...] = (
    "compute",
    "overlapped_comm",
    "exposed_transfer",
    "exposed_wait",
    "exposed_comm_unsplit",
    "memcpy",
    "input_wait",
    "host_launch_gap",
    "idle",
    "unclassified",
)
EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Merged:
    """A set of intervals as sorted, disjoint [start, end) pieces."""

    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, starts: np.ndarray, ends: np.ndarray) -> Merged:
        keep = ends > starts
        s, e = starts[keep], ends[keep]
        if len(s) == 0:
            return cls(EMPTY, EMPTY)
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        run = np.maximum.accumulate(e)
        new = np.ones(len(s), dtype=bool)
        new[1:] = s[1:] > run[:-1]
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, len(s) - 1)
        return cls(s[first], run[last])

    def cuts(self, lo: int, hi: int) -> np.ndarray:
        """Interval ends and starts that fall inside [lo, hi]."""
        i0 = int(np.searchsorted(self.end, lo, side="right"))
        i1 = int(np.searchsorted(self.start, hi, side="left"))
        return np.clip(np.concatenate([self.start[i0:i1], self.end[i0:i1]]), lo, hi)

    def covers(self, x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self.start, x, side="right") - 1
        jc = np.clip(j, 0, None)
        if len(self.start) == 0:
            return np.zeros(len(x), dtype=bool)
        return (j >= 0) & (x < self.end[jc])


@dataclass
class Labelled:
    """Possibly overlapping intervals with a label; finds a covering interval's label."""

    start: np.ndarray
    reach: np.ndarray  # running max of ends
    owner_label: np.ndarray  # label of the interval that reaches furthest so far

    @classmethod
    def of(cls, starts: np.ndarray, ends: np.ndarray, labels: np.ndarray) -> Labelled:
        order = np.argsort(starts, kind="stable")
        s, e, lab = starts[order], ends[order], labels[order]
        reach = np.maximum.accumulate(e) if len(e) else EMPTY
        idx = np.arange(len(e))
        owner = np.maximum.accumulate(np.where(e >= reach, idx, 0)) if len(e) else EMPTY
        return cls(s, reach, lab[owner] if len(e) else EMPTY)

    def label_at(self, x: np.ndarray, missing: int = -1) -> np.ndarray:
        if len(self.start) == 0:
            return np.full(len(x), missing, dtype=np.int64)
        j = np.searchsorted(self.start, x, side="right") - 1
        jc = np.clip(j, 0, None)
        ok = (j >= 0) & (self.reach[jc] > x)
        return np.where(ok, self.owner_label[jc], missing)


@dataclass
class Timeline:
    """One rank's intervals by category, prepared once for all its steps."""

    gpu: bool
    compute: Merged
    memcpy: Merged
    transfer: Merged
    wait: Merged
    wait_peers: Labelled
    unsplit: Merged
    inputs: Merged
    next_start: np.ndarray  # GPU op starts, ascending
    next_launch_end: np.ndarray  # their launch calls' ends (-1: unknown)


@dataclass
class LedgerRow:
    rank: int
    step: int
    start_ns: int
    wall_ns: int
    buckets: dict[str, int]
    wait_by_peer: dict[int, int] = field(default_factory=dict)
    visual_overlap_ns: int = 0  # waiting communication hidden under compute
    unknown_overlap_ns: int = 0  # unmatched communication under compute
    comm_ns: int = 0  # time any communication op runs, overlapped or not

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "step": self.step,
            "wall_ns": self.wall_ns,
            **{f"{b}_ns": v for b, v in self.buckets.items()},
            "wait_by_peer_ns": {str(k): v for k, v in sorted(self.wait_by_peer.items())},
            "visual_overlap_ns": self.visual_overlap_ns,
            "unknown_overlap_ns": self.unknown_overlap_ns,
            "comm_ns": self.comm_ns,
        }


def _comm_parts(ops: list[CommOp], table: CollectiveTable) -> dict[str, np.ndarray]:
    """Transfer, wait (with peer) and unsplit intervals of a rank's comm ops."""
    t_s, t_e, w_s, w_e, w_p, u_s, u_e = ([] for _ in range(7))
    for op in ops:
        coll = table.colls[op.coll] if op.coll >= 0 else None
        if coll is None or coll.transfer_ns is None:
            u_s.append(op.start)
            u_e.append(op.end)
            continue
        cut = op.end - min(coll.transfer_ns, op.dur)
        if cut > op.start:
            w_s.append(op.start)
            w_e.append(cut)
            w_p.append(coll.last_rank)
        t_s.append(cut)
        t_e.append(op.end)
    arr = {
        k: np.array(v, dtype=np.int64)
        for k, v in zip(
            ("t_s", "t_e", "w_s", "w_e", "w_p", "u_s", "u_e"),
            (t_s, t_e, w_s, w_e, w_p, u_s, u_e),
            strict=True,
        )
    }
    return arr


def timeline(trace: RankTrace, links: Links, ops: list[CommOp], table: CollectiveTable) -> Timeline:
    parts = _comm_parts(ops, table)
    gpu = trace.has_gpu
    compute_kinds = (Kind.KERNEL,) if gpu else (Kind.CPU_OP,)
    c = trace.select(*compute_kinds)
    m = trace.select(Kind.MEMCPY, Kind.MEMSET)
    i = trace.select(Kind.INPUT)
    nxt = trace.select(Kind.KERNEL, Kind.COMM_KERNEL, Kind.MEMCPY, Kind.MEMSET)
    _, launch_end = links.launch_times(nxt)
    return Timeline(
        gpu=gpu,
        compute=Merged.of(trace.start[c], trace.end[c]),
        memcpy=Merged.of(trace.start[m], trace.end[m]),
        transfer=Merged.of(parts["t_s"], parts["t_e"]),
        wait=Merged.of(parts["w_s"], parts["w_e"]),
        wait_peers=Labelled.of(parts["w_s"], parts["w_e"], parts["w_p"]),
        unsplit=Merged.of(parts["u_s"], parts["u_e"]),
        inputs=Merged.of(trace.start[i], trace.end[i]),
        next_start=trace.start[nxt],
        next_launch_end=launch_end,
    )


def _segments(
    tl: Timeline, lo: int, hi: int, extra: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the pieces [lo, hi) is cut into (also at `extra`)."""
    sets = (tl.compute, tl.memcpy, tl.transfer, tl.wait, tl.unsplit, tl.inputs)
    cuts = [np.array([lo, hi], dtype=np.int64), *(m.cuts(lo, hi) for m in sets)]
    if extra is not None:
        cuts.append(extra)
    if tl.gpu:
        le = tl.next_launch_end
        cuts.append(le[(le > lo) & (le < hi)])
    b = np.sort(np.concatenate(cuts))
    b = b[np.concatenate([[True], b[1:] != b[:-1]])]  # sort-based unique: faster here
    return b[:-1], np.diff(b)


def _idle_kind(tl: Timeline, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For idle pieces starting at x: (next op launched later, next op already queued)."""
    j = np.searchsorted(tl.next_start, x, side="left")
    has = j < len(tl.next_start)
    le = np.where(has, tl.next_launch_end[np.clip(j, 0, max(len(tl.next_start) - 1, 0))], -1)
    if len(tl.next_start) == 0:
        le = np.full(len(x), -1)
    known = has & (le >= 0)
    return known & (le > x), known & (le <= x)


def _classify(tl: Timeline, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Bucket number (index into BUCKETS) of each piece starting at x."""
    c, t, w, u = (
        tl.compute.covers(x),
        tl.transfer.covers(x),
        tl.wait.covers(x),
        tl.unsplit.covers(x),
    )
    inp = tl.inputs.covers(x)
    if tl.gpu:
        m = tl.memcpy.covers(x)
        later, queued = _idle_kind(tl, x)
        conds = [c & t, c, t, w, u, m, inp, later, queued]
        names = [
            "overlapped_comm",
            "compute",
            "exposed_transfer",
            "exposed_wait",
            "exposed_comm_unsplit",
            "memcpy",
            "input_wait",
            "host_launch_gap",
            "idle",
        ]
    else:
        conds = [t, w, u, inp, c]
        names = [
            "exposed_transfer",
            "exposed_wait",
            "exposed_comm_unsplit",
            "input_wait",
            "compute",
        ]
    choice = [BUCKETS.index(n) for n in names]
    bucket = np.select(conds, choice, default=BUCKETS.index("unclassified"))
    return bucket, {"c": c, "w": w, "u": u, "t": t}


def step_row(tl: Timeline, rank: int, step: int, lo: int, hi: int) -> LedgerRow:
    """The ledger of one rank's step window [lo, hi)."""
    x, length = _segments(tl, lo, hi)
    bucket, cov = _classify(tl, x)
    totals = {b: int(length[bucket == k].sum()) for k, b in enumerate(BUCKETS)}
    row = LedgerRow(rank, step, lo, hi - lo, totals)
    waiting = bucket == BUCKETS.index("exposed_wait")
    if waiting.any():
        peers = tl.wait_peers.label_at(x[waiting])
        for p in np.unique(peers):
            row.wait_by_peer[int(p)] = int(length[waiting][peers == p].sum())
    row.visual_overlap_ns = int(length[cov["c"] & cov["w"] & ~cov["t"]].sum())
    row.unknown_overlap_ns = int(length[cov["c"] & cov["u"] & ~cov["t"] & ~cov["w"]].sum())
    row.comm_ns = int(length[cov["t"] | cov["w"] | cov["u"]].sum())
    return row


@dataclass
class Ledger:
    rows: list[LedgerRow]
    gpu: dict[int, bool]

    def check(self) -> list[str]:
        """Rows whose buckets do not add up to the wall time (must be none)."""
        return [
            f"rank {r.rank} step {r.step}: {sum(r.buckets.values())} != {r.wall_ns}"
            for r in self.rows
            if sum(r.buckets.values()) != r.wall_ns
        ]

    def for_rank(self, rank: int) -> list[LedgerRow]:
        return [r for r in self.rows if r.rank == rank]

    def for_step(self, step: int) -> list[LedgerRow]:
        return [r for r in self.rows if r.step == step]


def rank_rows(
    tl: Timeline, rank: int, numbers: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> list[LedgerRow]:
    """The ledger of all of a rank's steps in one pass: the same pieces and rules as
    step_row, cut once over the whole timeline and summed per step (a rank has
    hundreds of steps; one numpy pass beats hundreds of small ones). Sums are exact:
    float64 holds integers below 2**53 ns (104 days) exactly."""
    if len(lo) == 0:
        return []
    x, length = _segments(tl, int(lo[0]), int(hi[-1]), np.concatenate([lo, hi]))
    i = np.searchsorted(lo, x, side="right") - 1
    inside = (i >= 0) & (x < hi[np.clip(i, 0, None)])
    x, length, i = x[inside], length[inside], i[inside]
    bucket, cov = _classify(tl, x)
    nb, ns = len(BUCKETS), len(lo)
    sums = np.bincount(i * nb + bucket, weights=length, minlength=ns * nb).reshape(ns, nb)
    vis = np.bincount(i, weights=length * (cov["c"] & cov["w"] & ~cov["t"]), minlength=ns)
    unk = np.bincount(
        i, weights=length * (cov["c"] & cov["u"] & ~cov["t"] & ~cov["w"]), minlength=ns
    )
    comm = np.bincount(i, weights=length * (cov["t"] | cov["w"] | cov["u"]), minlength=ns)
    rows = [
        LedgerRow(
            rank,
            int(n),
            int(a),
            int(b - a),
            {k: int(v) for k, v in zip(BUCKETS, s, strict=True)},
            visual_overlap_ns=int(va),
            unknown_overlap_ns=int(ua),
            comm_ns=int(ca),
        )
        for n, a, b, s, va, ua, ca in zip(numbers, lo, hi, sums, vis, unk, comm, strict=True)
    ]
    waiting = bucket == BUCKETS.index("exposed_wait")
    if waiting.any():
        peers = tl.wait_peers.label_at(x[waiting])
        for step_i, peer, ln in zip(i[waiting], peers, length[waiting], strict=True):
            row = rows[int(step_i)]
            row.wait_by_peer[int(peer)] = row.wait_by_peer.get(int(peer), 0) + int(ln)
    return rows


def _disjoint(lo: np.ndarray, hi: np.ndarray) -> bool:
    return bool(np.all(lo[1:] >= hi[:-1])) if len(lo) > 1 else True


def build(
    traces: list[RankTrace], links: dict[int, Links], steps: StepTable, table: CollectiveTable
) -> Ledger:
    """The ledger of every rank and step (see module doc)."""
    rows = []
    gpu = {}
    for t in traces:
        tl = timeline(t, links[t.rank], table.ops.get(t.rank, []), table)
        gpu[t.rank] = tl.gpu
        rs = steps.ranks[t.rank]
        if _disjoint(rs.start, rs.end):
            rows += rank_rows(tl, t.rank, rs.numbers, rs.start, rs.end)
            continue
        # overlapping step windows (unusual markers): each step on its own
        for n, lo, hi in zip(rs.numbers, rs.start, rs.end, strict=True):
            rows.append(step_row(tl, t.rank, int(n), int(lo), int(hi)))
    return Ledger(rows, gpu)


def mean_buckets(rows: list[LedgerRow]) -> dict[str, float]:
    """Mean of every bucket and of the wall time over rows (ns)."""
    if not rows:
        return {b: 0.0 for b in (*BUCKETS, "wall")}
    out = {b: float(np.mean([r.buckets[b] for r in rows])) for b in BUCKETS}
    out["wall"] = float(np.mean([r.wall_ns for r in rows]))
    return out
