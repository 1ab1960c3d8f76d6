"""Desync: ranks of one communicator that issued different collectives at the same
point (size, or function: then the rank's own count of collectives on the
communicator, op_index, is ahead of its peers' at the same seq, because it
issued an op they did not), and P2P pairs whose Send and Recv sizes differ.

The odd rank is the one that differs from the lower median of its instance
(the majority when there are three or more ranks; with two, the one ahead, or
the larger). A rank ahead must stay ahead for `persist` consecutive ops (a
record that reaches the stream late shifts op_index for a moment only); a size
mismatch is one op. Records that do not pair the same work as their peers'
are marked `misaligned` so the timing detectors skip them, and every record of
a desynced (rank, communicator) from then on.
"""

from __future__ import annotations

import numpy as np

from rankwatch.detect.base import Context, Window
from rankwatch.detect.cohorts import Cohorts
from rankwatch.detect.robust import run_lengths, run_tails
from rankwatch.detect.topology import FUNCS
from rankwatch.model import Finding, Since

MAX_LISTED = 8


def lower_median(values: np.ndarray, group: np.ndarray, n_groups: int, start=None) -> np.ndarray:
    """The lower median of each group; groups contiguous from `start` when given,
    where a group whose values are all equal (the usual case) needs no sort."""
    if start is not None and len(values):
        head = values[start]
        if np.array_equal(values, head[group]):  # one pass instead of two reductions
            return head
        lo = np.minimum.reduceat(values, start)
        hi = np.maximum.reduceat(values, start)
        if np.array_equal(lo, hi):
            return lo
        mixed = np.flatnonzero(lo != hi)
        out = lo.copy()
        sel = np.flatnonzero(np.isin(group, mixed))
        local = np.searchsorted(mixed, group[sel])
        out[mixed] = lower_median(values[sel], local, len(mixed))
        return out
    order = np.lexsort((values, group))
    counts = np.bincount(group, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pick = order[np.minimum(starts + (np.maximum(counts, 1) - 1) // 2, len(order) - 1)]
    return values[pick]


class DesyncDetector:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.found: dict[tuple[int, int, str], dict] = {}
        self.bad = np.zeros(ctx.topo.n_slots, dtype=bool)  # desynced (comm, rank) slots
        self.ahead = np.zeros(ctx.topo.n_slots, dtype=np.int64)  # consecutive ops ahead

    def feed(self, window: Window) -> None:
        c = window.cohorts
        if c is None:
            return
        r = c.recs
        ref_idx = lower_median(r.op_index, c.inst, c.n_inst, c.inst_start)[c.inst]
        ref_msg = lower_median(r.msg, c.inst, c.n_inst, c.inst_start)[c.inst]
        coll = ~r.p2p
        ahead = self._persistent(r, coll, coll & (r.op_index > ref_idx))
        size = coll & (r.op_index == ref_idx) & (r.msg != ref_msg) & (r.msg >= 0) & (ref_msg >= 0)
        p2p_size = r.p2p & (r.msg != ref_msg) & (r.msg >= 0) & (ref_msg >= 0)
        for mask, cause in ((ahead, "func"), (size, "size"), (p2p_size, "size")):
            if mask.any():
                self._record(c, np.flatnonzero(mask), cause, ref_msg)
        off = coll & (r.op_index != ref_idx)
        self.bad[r.cslot[ahead]] = True
        r.misaligned = off | self.bad[r.cslot]

    def _persistent(self, r, coll, ahead) -> np.ndarray:
        """The first op of each run of `persist` ops ahead of the peers, per (comm, rank)."""
        idx = np.flatnonzero(coll)
        if not ahead.any():  # the usual case: no run goes on, none begins
            self.ahead[r.cslot[idx]] = 0
            return np.zeros(len(r), dtype=bool)
        order = idx[np.lexsort((r.op_index[idx], r.cslot[idx]))]
        slot = r.cslot[order]
        run, started = run_lengths(ahead[order], slot, self.ahead)
        last = np.flatnonzero(run_tails(slot))
        self.ahead[slot[last]] = run[last]
        out = np.zeros(len(r), dtype=bool)
        fired = (run >= self.ctx.config.persist) & (started >= 0)
        out[order[started[fired]]] = True
        # a run that began in an earlier window: report its current op
        out[order[(run == self.ctx.config.persist) & (started < 0)]] = True
        return out

    def _record(self, c: Cohorts, idx: np.ndarray, cause: str, ref_msg: np.ndarray) -> None:
        r = c.recs
        for i in idx.tolist():
            key = (int(r.proc[i]), int(r.comm[i]), cause)
            entry = self.found.get(key)
            if entry is None:
                entry = self._first(c, i, cause, ref_msg)
                self.found[key] = entry
            entry["ops"] += 1

    def _first(self, c: Cohorts, i: int, cause: str, ref_msg: np.ndarray) -> dict:
        r = c.recs
        inst = np.flatnonzero(c.inst == c.inst[i])
        peers = [
            {
                "rank": int(self.ctx.topo.procs[int(r.proc[j])].world_rank),
                "func": FUNCS[r.func[j]],
                "seq": int(r.seq[j]),
                "msg_bytes": int(r.msg[j]),
                "op_index": int(r.op_index[j]),
            }
            for j in inst[:MAX_LISTED]
        ]
        return {
            "proc": int(r.proc[i]),
            "comm": int(r.comm[i]),
            "cause": cause,
            "seq": int(r.seq[i]),
            "func": FUNCS[r.func[i]],
            "ns": float(r.arrival_c[i]),
            "msg_bytes": int(r.msg[i]),
            "expected_msg_bytes": int(ref_msg[i]),
            "peers": peers,
            "ranks": int(len(inst)),
            "ops": 0,
        }

    def findings(self) -> list[Finding]:
        topo = self.ctx.topo
        out = []
        for e in self.found.values():
            n = e["ranks"]
            evidence = {
                "op": {"func": e["func"], "seq": e["seq"], "msg_bytes": e["msg_bytes"]},
                "peers_msg_bytes": e["expected_msg_bytes"],
                "members": e["peers"],
                "mismatched_ops": e["ops"],
            }
            if e["cause"] == "func":
                evidence["note"] = (
                    "this rank had issued one more collective on the communicator than its "
                    "peers when they issued this one"
                )
            out.append(
                Finding(
                    kind="desync",
                    **topo.who(e["proc"]),
                    comm=topo.comm_ref(e["comm"]),
                    since=Since(topo.abs_ns(e["ns"]), e["seq"]),
                    cause=e["cause"],
                    confidence=0.95 if n >= 3 else 0.6,
                    evidence=evidence,
                )
            )
        return out
