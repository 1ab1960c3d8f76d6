"""What-if cost of each straggler: the job time it cost.

The aligned ops of a step are replayed with a culprit's delays removed: its
local segments shrink by their residual over its peers' median (and its
baseline), or, for a transfer culprit, the transfer of the instances it is in
shrinks back to their baseline. Each op then starts when its process's previous
op ends (replayed) plus its (shortened) segment, and ends when its last member
starts plus its own tail, so a delay that others absorbed costs nothing and one
the whole job waited on costs all of it. Steps are the segments between
collectives spanning every rank; what the step's closing collective gains is
the job time saved. Steps are replayed as they complete; the last few are kept
so a culprit confirmed a few steps after its onset is still costed from it.
Reported per culprit and for all of them together (delays of several
stragglers overlap, so the total is not the sum).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rankwatch.detect.base import Context, Window
from rankwatch.detect.records import Recs

COLUMNS = ("proc", "comm", "uid", "prev_uid", "gstart_c", "gend_c", "d_gap", "d_xfer")
MAX_OPEN = 4_000_000  # records of a step without a world collective before it is cut


class Segment:
    """One closed stretch of ops ending at a collective that spans every rank, ready
    to be replayed: instances in order of their end, each record pointing at the
    instance its process's previous op belonged to."""

    def __init__(self, recs: Recs) -> None:
        self.raw = recs
        self.built = False
        self.saving: dict[tuple, float] = {}  # culprit set -> saving ns

    def _build(self) -> None:
        """Sort into instances and chunks, once, when first replayed."""
        self.built = True
        recs = self.raw
        ok = np.isfinite(recs.gstart_c) & np.isfinite(recs.gend_c)
        r = recs.take(np.flatnonzero(ok))
        uniq, inv = np.unique(r.uid, return_inverse=True)
        inv = inv.reshape(-1)
        end = np.full(len(uniq), -np.inf)
        np.maximum.at(end, inv, r.gend_c)
        rank_of = np.empty(len(uniq), dtype=np.int64)
        rank_of[np.argsort(end, kind="stable")] = np.arange(len(uniq))
        inst = rank_of[inv]  # instance position in end order
        order = np.argsort(inst, kind="stable")
        self.r = r.take(order)
        self.inst = inst[order]
        self.n = len(uniq)
        self.starts = (
            np.flatnonzero(np.r_[True, self.inst[1:] != self.inst[:-1]]) if len(order) else order
        )
        pos = np.minimum(np.searchsorted(uniq, self.r.prev_uid), max(len(uniq) - 1, 0))
        known = (len(uniq) > 0) & (uniq[pos] == self.r.prev_uid) if len(uniq) else np.zeros(0, bool)
        self.prev = np.where(known, rank_of[pos], -1) if len(uniq) else np.zeros(0, np.int64)
        self.g_max = (
            np.maximum.reduceat(self.r.gstart_c, self.starts) if len(order) else np.zeros(0)
        )
        self.chunks = _chunks(self.inst, self.prev, self.n)

    contrib: dict = {}

    def touches(self, culprit: tuple[int, str]) -> bool:
        proc, cause = culprit
        r = self.raw
        mine = r.proc == proc
        if cause == "transfer":
            return bool(np.any(r.d_xfer[np.isin(r.uid, r.uid[mine])] > 0))
        return bool(np.any(r.d_gap[mine] > 0))

    def replay(self, culprits: tuple[tuple[int, str], ...]) -> float:
        """Job time saved (ns, >= 0) with these culprits' delays removed."""
        if culprits in self.saving:
            return self.saving[culprits]
        if not self.built:
            self._build()
        r = self.r
        local = [p for p, c in culprits if c != "transfer"]
        xfer = [p for p, c in culprits if c == "transfer"]
        dgap = np.where(np.isin(r.proc, local), r.d_gap, 0.0)
        cut = np.zeros(self.n)
        if xfer:
            hit = np.zeros(self.n, dtype=bool)
            hit[self.inst[np.isin(r.proc, xfer)]] = True
            np.maximum.at(cut, self.inst, np.where(hit[self.inst], r.d_xfer, 0.0))
        saving = self._replay(dgap, cut) if (dgap.any() or cut.any()) else 0.0
        self.saving[culprits] = saving
        return saving

    def _replay(self, dgap: np.ndarray, cut: np.ndarray) -> float:
        shift = np.zeros(self.n)
        g = self.r.gstart_c
        for a, b in self.chunks:
            lo, hi = self.starts[a], (self.starts[b] if b < self.n else len(g))
            prev = self.prev[lo:hi]
            gp = g[lo:hi] + np.where(prev >= 0, shift[np.maximum(prev, 0)], 0.0) - dgap[lo:hi]
            top = np.maximum.reduceat(gp, self.starts[a:b] - lo)
            shift[a:b] = np.minimum(0.0, top - self.g_max[a:b] - cut[a:b])
        return float(-shift[-1]) if self.n else 0.0


def _chunks(inst: np.ndarray, prev: np.ndarray, n: int) -> list[tuple[int, int]]:
    """Runs of instances (in end order) none of which depends on another of the same
    run, so each run is replayed in one vectorised step."""
    dep = np.full(n, -1, dtype=np.int64)
    np.maximum.at(dep, inst, prev)
    out, start = [], 0
    while start < n:
        later = np.flatnonzero(dep[start + 1 :] >= start)
        end = start + 1 + int(later[0]) if len(later) else n
        out.append((start, end))
        start = end
    return out


def _inst_max(uid: np.ndarray, v: np.ndarray) -> np.ndarray:
    uniq, inv = np.unique(uid, return_inverse=True)
    out = np.full(len(uniq), -np.inf)
    np.maximum.at(out, inv.reshape(-1), np.where(np.isfinite(v), v, -np.inf))
    return out[inv.reshape(-1)]


class CostDetector:
    """Keeps the current step's records and the last few steps; replays each step for
    every known culprit (its delays removed alone: marginal cost), for all of them
    (total), and for all but one (what that one costs once the others are fixed:
    a straggler masked by a bigger one costs nothing marginally, but is not free)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.open: list[Recs] = []
        self.open_n = 0
        self.recent: deque[Segment] = deque()
        self.frozen: dict[str, dict] = {
            "total": {(): 0.0},
            "marginal": {},
            "alone": {},
            "steps": {},
        }
        self.known: tuple[tuple[int, str], ...] = ()

    def feed(self, window: Window) -> None:
        now = tuple(sorted(self.ctx.culprits))
        if now != self.known:  # culprits confirmed since: re-cost the steps still kept
            self.known = now
            for seg in self.recent:
                self._account(seg)
        c = window.cohorts
        if c is not None and len(c):
            r = c.recs
            cols = {k: getattr(r, k) for k in COLUMNS if k in r}
            cols.setdefault("d_gap", np.zeros(len(r)))
            cols.setdefault("d_xfer", np.zeros(len(r)))
            self.open.append(Recs(cols))
            self.open_n += len(r)
            self._close(self._world_ends(c))
        if window.final and self.open:
            self._close(np.array([np.inf]))
        self._publish()

    def _world_ends(self, c) -> np.ndarray:
        world = self.ctx.topo.world
        r = c.recs
        if world is None:
            return np.array([np.inf]) if self.open_n > MAX_OPEN else np.zeros(0)
        mask = (r.comm == world) & ~r.p2p
        if not mask.any():
            return np.zeros(0)
        return np.unique(_inst_max(r.uid[mask], r.gend_c[mask]))  # one step per world collective

    def _close(self, ends: np.ndarray) -> None:
        """Cut the open records into steps ending at each world collective's end."""
        if not len(ends):
            return
        allr = Recs.concat(self.open)
        end = np.where(np.isfinite(allr.gend_c), allr.gend_c, -np.inf)
        step = np.searchsorted(ends, end, side="left")  # records after the last end: len(ends)
        order = np.argsort(step, kind="stable")
        bounds = np.searchsorted(step[order], np.arange(len(ends) + 1))
        for k in range(len(ends)):
            part = order[bounds[k] : bounds[k + 1]]
            if len(part) and (np.any(allr.d_gap[part] > 0) or np.any(allr.d_xfer[part] > 0)):
                self._add(Segment(allr.take(part)))
        rest = allr.take(order[bounds[-1] :])
        self.open, self.open_n = ([rest], len(rest)) if len(rest) else ([], 0)

    def _add(self, seg: Segment) -> None:
        self.recent.append(seg)
        self._account(seg)
        if len(self.recent) > self.ctx.config.recent_segments:
            self._freeze(self.recent.popleft())

    def _account(self, seg: Segment) -> None:
        """The segment's contributions under the current culprits."""
        known = self.known
        touched = [c for c in known if seg.touches(c)]
        total = seg.replay(known) if touched else 0.0
        marginal = {c: seg.replay((c,)) for c in touched}
        if len(known) == 1:
            alone = dict(marginal)
        else:
            alone = {c: total - seg.replay(tuple(k for k in known if k != c)) for c in touched}
        seg.contrib = {
            "total": total,
            "marginal": marginal,
            "alone": alone,
            "steps": dict.fromkeys(touched, 1),
        }

    def _freeze(self, seg: Segment) -> None:
        f = self.frozen
        f["total"][()] += seg.contrib["total"]
        for name in ("marginal", "alone", "steps"):
            for c, v in seg.contrib[name].items():
                f[name][c] = f[name].get(c, 0) + v

    def _sum(self, name: str, c) -> float:
        kept = sum(seg.contrib[name].get(c, 0) for seg in self.recent)
        return self.frozen[name].get(c, 0) + kept

    def _publish(self) -> None:
        for key, cul in self.ctx.culprits.items():
            cul.cost_ns = self._sum("marginal", key)
            cul.extra["cost_alone_ns"] = self._sum("alone", key)
            cul.cost_segments = int(self._sum("steps", key))
        self.ctx.total_cost_ns = self.frozen["total"][()] + sum(
            seg.contrib["total"] for seg in self.recent
        )

    def findings(self) -> list:
        return []  # costs are part of the straggler findings; the total is in Context
