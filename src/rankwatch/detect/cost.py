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

from rankwatch.detect import kernels
from rankwatch.detect.base import Context, Window
from rankwatch.detect.records import Recs
from rankwatch.detect.robust import run_heads, run_tails, stable_order

COLUMNS = ("proc", "uid", "prev_uid", "gstart_c", "gend_c", "d_gap", "d_xfer")
MAX_OPEN = 4_000_000  # records of a step without a world collective before it is cut
STEPS_RECORDS = 32768  # records of the steps replayed together (see Steps)


class Steps:
    """Closed steps of one batch that hold a delay (up to about STEPS_RECORDS records
    of them), replayed together: the replay of one step is a handful of numpy calls
    per level of its dependency graph, so replaying many steps at once costs about
    what one step did.

    Each step's instances (records of one uid) are ordered by their end, and each
    record points at the instance its process's previous op belonged to in the
    same step (`prev`). The compiled replay (kernels.replay) takes the instances
    one after the other in that order; without it, an instance's level is one more
    than the highest level of the earlier instances it points at, a level depends
    only on lower ones, and one vectorised pass per level replays every step of the
    batch. Either way a record that points at its own or a later instance reads no
    shift (that instance has not been replayed when it is read).

    Only the steps that a known culprit's delays touch are built and replayed
    (`plan`); once the batch's steps are accounted, all but the last few (the ones
    still kept for late confirmations) are dropped (`trim`)."""

    def __init__(self, source: Recs, sel: np.ndarray, seg: np.ndarray, n_seg: int) -> None:
        self.source, self.sel = source, sel  # the steps' records are source[sel]
        self.seg = seg  # step of each record, 0..n_seg-1
        self.n_seg = n_seg
        # only steps that a known culprit's delays touch are replayed (and built)
        self.planned = np.zeros(n_seg, dtype=bool)
        self.built = False
        self.saving: dict[tuple, np.ndarray] = {}  # culprit set -> saving ns per step
        self._touches: dict[tuple[int, str], np.ndarray] = {}

    def __len__(self) -> int:
        """Records held."""
        return len(self.sel)

    def _col(self, name: str, where: np.ndarray | None = None) -> np.ndarray:
        sel = self.sel if where is None else self.sel[where]
        return getattr(self.source, name)[sel]

    def plan(self, culprits: tuple[tuple[int, str], ...], more: np.ndarray | None = None) -> None:
        """Make the steps these culprits touch (and `more`) replayable."""
        want = np.zeros(self.n_seg, dtype=bool) if more is None else more.copy()
        for c in culprits:
            want |= self.touches(c)
        if (want & ~self.planned).any():
            self.planned |= want
            self.built = False
            self.saving = {}  # recomputed alike, now for more steps

    def trim(self, first: int) -> None:
        """Keep the records of steps first.. only (the earlier ones are frozen), taken
        out of the batch so that it can go."""
        keep = np.flatnonzero(self.seg >= first)
        self.source = Recs({k: self._col(k, keep) for k in COLUMNS})
        self.sel, self.seg = np.arange(len(keep)), self.seg[keep]
        self.built = False

    # ------------------------------------------------------------------ build
    def _build(self) -> None:
        self.built = True
        mine = np.flatnonzero(self.planned[self.seg])
        raw = Recs({k: self._col(k, mine) for k in COLUMNS})
        keep = np.flatnonzero(np.isfinite(raw.gstart_c) & np.isfinite(raw.gend_c))
        seg = self.seg[mine][keep]
        got = kernels.instances(raw.uid[keep], seg, raw.gend_c[keep], raw.prev_uid[keep])
        self.compiled = got is not None
        if got is None:
            got = _instances_numpy(raw.uid[keep], seg, raw.gend_c[keep], raw.prev_uid[keep])
        inst, n, inst_seg, inst_uid, end, prev = got
        # position: by step, then end, then uid (the order one step's replay runs in)
        by_pos = np.lexsort((inst_uid, end, inst_seg))
        pos_of = np.empty(n, dtype=np.int64)
        pos_of[by_pos] = np.arange(n)
        pos = pos_of[inst]
        prev_pos = np.where(prev >= 0, pos_of[np.maximum(prev, 0)], -1)
        back = (prev_pos >= 0) & (prev_pos < pos)  # earlier instances only (see doc)
        # q numbers instances in the order they are replayed in: by position for the
        # compiled replay (one instance after the other), else by level, then position
        if self.compiled:
            q_of = np.arange(n)
        else:
            level = _levels(pos[back], prev_pos[back], n)  # per position
            q_of = np.empty(n, dtype=np.int64)
            q_of[stable_order(level, int(level.max()) + 1 if n else 1)] = np.arange(n)
            # where each level's instances begin, in q order (the replay's passes)
            self.levels = (
                np.searchsorted(np.sort(level), np.arange(int(level.max()) + 2)) if n else []
            )
        q = q_of[pos]
        order = stable_order(q, n)
        rec = keep[order]
        self.q = q[order]
        self.g = raw.gstart_c[rec]
        self.proc = raw.proc[rec]
        self.d_gap = raw.d_gap[rec]
        self.d_xfer = raw.d_xfer[rec]
        self.prev = np.where(back, q_of[np.maximum(prev_pos, 0)], -1)[order]
        self.n = n
        self.starts = np.flatnonzero(run_heads(self.q))
        self.g_max = np.maximum.reduceat(self.g, self.starts) if n else np.zeros(0)
        self.rec_seg = seg[order]
        self.seg_q = np.empty(n, dtype=np.int64)
        self.seg_q[self.q] = self.rec_seg
        # each step's last instance in end order: what the job waits on
        last = np.full(self.n_seg, -1, dtype=np.int64)
        if n:
            seg_by_pos = inst_seg[by_pos]
            end_pos = np.flatnonzero(run_tails(seg_by_pos))
            last[seg_by_pos[end_pos]] = end_pos
        self.last_q = np.where(last >= 0, q_of[np.maximum(last, 0)], -1)

    # ------------------------------------------------------------------ queries
    def touches(self, culprit: tuple[int, str]) -> np.ndarray:
        """Per step: whether the culprit's delays show in it."""
        got = self._touches.get(culprit)
        if got is not None:
            return got
        proc, cause = culprit
        mine = self._col("proc") == proc
        if cause == "transfer":
            inst = _instances(self._col("uid"), self.seg)[0]
            theirs = np.zeros(int(inst.max()) + 1 if len(inst) else 0, dtype=bool)
            theirs[inst[mine]] = True
            delayed = theirs[inst] & (self._col("d_xfer") > 0)
        else:
            delayed = mine & (self._col("d_gap") > 0)
        got = np.bincount(self.seg[delayed], minlength=self.n_seg) > 0
        self._touches[culprit] = got
        return got

    def replay(self, culprits: tuple[tuple[int, str], ...]) -> np.ndarray:
        """Per step: job time saved (ns, >= 0) with these culprits' delays removed."""
        got = self.saving.get(culprits)
        if got is not None:
            return got
        if not self.built:
            self._build()
        local = [p for p, c in culprits if c != "transfer"]
        xfer = [p for p, c in culprits if c == "transfer"]
        dgap = np.where(np.isin(self.proc, local), self.d_gap, 0.0)
        cut = np.zeros(self.n)
        if xfer and self.n:
            hit = np.zeros(self.n, dtype=bool)
            hit[self.q[np.isin(self.proc, xfer)]] = True
            # records come grouped by instance (q): the largest cut of each
            cut = np.maximum.reduceat(np.where(hit[self.q], self.d_xfer, 0.0), self.starts)
            cut = np.maximum(cut, 0.0)
        # a step without any of these delays saves nothing (and is not replayed)
        moved = np.bincount(self.rec_seg[dgap != 0], minlength=self.n_seg) > 0
        moved |= np.bincount(self.seg_q[cut != 0], minlength=self.n_seg) > 0
        saving = np.zeros(self.n_seg)
        if moved.any():
            shift = self._replay(dgap, cut)
            done = moved & (self.last_q >= 0)
            saving[done] = -shift[self.last_q[done]]
        self.saving[culprits] = saving
        return saving

    def _replay(self, dgap: np.ndarray, cut: np.ndarray) -> np.ndarray:
        if self.compiled:
            return kernels.replay(self.starts, self.g, self.prev, dgap, self.g_max, cut)
        shift = np.zeros(self.n)
        g, prev, starts, lv = self.g, self.prev, self.starts, self.levels
        for a, b in zip(lv[:-1].tolist(), lv[1:].tolist(), strict=True):
            if a == b:
                continue
            lo, hi = starts[a], (starts[b] if b < self.n else len(g))
            p = prev[lo:hi]
            gp = g[lo:hi] + np.where(p >= 0, shift[np.maximum(p, 0)], 0.0) - dgap[lo:hi]
            top = np.maximum.reduceat(gp, starts[a:b] - lo)
            shift[a:b] = np.minimum(0.0, top - self.g_max[a:b] - cut[a:b])
        return shift


class Segment:
    """One closed step (a stretch of ops ending at a collective that spans every
    rank), held in the batch it closed in."""

    __slots__ = ("steps", "k", "contrib")

    def __init__(self, steps: Steps, k: int) -> None:
        self.steps, self.k = steps, k
        self.contrib: dict = {}

    def touches(self, culprit: tuple[int, str]) -> bool:
        return bool(self.steps.touches(culprit)[self.k])

    def replay(self, culprits: tuple[tuple[int, str], ...]) -> float:
        if not self.steps.planned[self.k]:  # not touched by these culprits: still exact
            more = np.zeros(self.steps.n_seg, dtype=bool)
            more[self.k] = True
            self.steps.plan(culprits, more)
        return float(self.steps.replay(culprits)[self.k])


def _instances_numpy(uid: np.ndarray, seg: np.ndarray, gend: np.ndarray, prev_uid: np.ndarray):
    """Steps._build's instances in NumPy (kernels.instances' result)."""
    inst, n, inst_seg, inst_uid, heads, run_inst, find = _instances(uid, seg)
    end = np.full(n, -np.inf)
    if n:  # the latest end of each run of an instance's records, then of each instance
        run_end = np.maximum.reduceat(gend, heads)
        if len(heads) == n:
            end[run_inst] = run_end
        else:
            np.maximum.at(end, run_inst, run_end)
    return inst, n, inst_seg, inst_uid, end, find(prev_uid, seg)


def _instances(uid: np.ndarray, seg: np.ndarray):
    """Instances (records of one uid in one step) of records that come grouped by
    instance: (instance of each record, their count, each instance's step and uid,
    the first record of each run of records of one instance, the instance of each
    run, and a lookup (uid, step) -> instance, -1 for none)."""
    n = len(uid)
    first = np.ones(n, dtype=bool)
    first[1:] = (uid[1:] != uid[:-1]) | (seg[1:] != seg[:-1])
    heads = np.flatnonzero(first)
    run = np.cumsum(first) - 1
    ru, rs = uid[heads], seg[heads]
    by_uid = np.argsort(ru)  # np.unique(ru, return_inverse=True, return_counts=True)
    su = ru[by_uid]
    new = run_heads(su)
    uniq = su[new]
    inv = np.empty(len(ru), dtype=np.int64)
    inv[by_uid] = np.cumsum(new) - 1
    cnt = np.diff(np.flatnonzero(new), append=len(su))
    n_u = len(uniq)

    def where_uid(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        j = np.minimum(np.searchsorted(uniq, u), max(n_u - 1, 0))
        return j, (uniq[j] == u) if n_u else np.zeros(len(u), dtype=bool)

    if not len(cnt) or cnt.max() == 1:  # the usual case: one run per uid, one step each
        step = np.empty(n_u, dtype=seg.dtype)
        step[inv] = rs

        def find(u: np.ndarray, s: np.ndarray) -> np.ndarray:
            j, ok = where_uid(u)
            return np.where(ok & (step[j] == s), j, -1)

        return inv[run], n_u, step, uniq, heads, inv, find
    key = rs.astype(np.int64) * n_u + inv
    ukey, inst = np.unique(key, return_inverse=True)
    inst = inst.reshape(-1)

    def find_key(u: np.ndarray, s: np.ndarray) -> np.ndarray:
        j, ok = where_uid(u)
        want = s.astype(np.int64) * n_u + j
        k = np.minimum(np.searchsorted(ukey, want), len(ukey) - 1)
        return np.where(ok & (ukey[k] == want), k, -1)

    return inst[run], len(ukey), ukey // n_u, uniq[ukey % n_u], heads, inst, find_key


def _levels(dst: np.ndarray, src: np.ndarray, n: int) -> np.ndarray:
    """Level of each of n nodes of a DAG given by edges src -> dst (src < dst): 0
    without incoming edges, else one more than its highest predecessor. Layer by
    layer (Kahn), so each edge is looked at once."""
    level = np.zeros(n, dtype=np.int64)
    if not len(src):
        return level
    indeg = np.bincount(dst, minlength=n)
    order = stable_order(src, n)
    out = dst[order]
    count = np.bincount(src, minlength=n)
    begin = np.cumsum(count) - count
    frontier = np.flatnonzero(indeg == 0)
    depth = 0
    while len(frontier):
        level[frontier] = depth
        cnt = count[frontier]
        total = int(cnt.sum())
        if not total:
            break
        idx = np.repeat(begin[frontier] - (np.cumsum(cnt) - cnt), cnt) + np.arange(total)
        d = out[idx]
        indeg -= np.bincount(d, minlength=n)
        reached = np.zeros(n, dtype=bool)
        reached[d] = True
        frontier = np.flatnonzero(reached & (indeg == 0))
        depth += 1
    return level


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
            for steps in {id(seg.steps): seg.steps for seg in self.recent}.values():
                steps.plan(now)
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
        # one step per world collective: its latest end (records come grouped by instance)
        uid, end = r.uid[mask], r.gend_c[mask]
        heads = np.flatnonzero(run_heads(uid))
        return np.unique(np.maximum.reduceat(np.where(np.isfinite(end), end, -np.inf), heads))

    def _close(self, ends: np.ndarray) -> None:
        """Cut the open records into steps ending at each world collective's end."""
        if not len(ends):
            return
        allr = Recs.concat(self.open)
        end = np.where(np.isfinite(allr.gend_c), allr.gend_c, -np.inf)
        step = np.searchsorted(ends, end, side="left")  # records after the last end: len(ends)
        order = stable_order(step, len(ends) + 1)
        delayed = (allr.d_gap > 0) | (allr.d_xfer > 0)
        kept = np.bincount(step[delayed], minlength=len(ends) + 1)[: len(ends)] > 0
        if kept.any():  # steps without a delay cost nothing: never replayed
            sel = order[np.append(kept, False)[step[order]]]
            seg = (np.cumsum(kept) - 1)[step[sel]]  # 0.. over the kept steps
            per = np.bincount(seg)
            # steps replayed together, up to about STEPS_RECORDS records (a bound on the
            # memory a replay takes), each step whole
            chunk = (np.cumsum(per) - per) // STEPS_RECORDS
            cut = np.flatnonzero(np.diff(chunk, prepend=-1, append=-1))
            made = []
            for a, b in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True):
                lo, hi = np.searchsorted(seg, [a, b])
                steps = Steps(allr, sel[lo:hi], seg[lo:hi] - a, b - a)
                steps.plan(self.known)
                for k in range(steps.n_seg):
                    self._add(Segment(steps, k))
                made.append(steps)
            # keep the records of steps still kept (not frozen) only
            first: dict[int, int] = {}
            for s in self.recent:
                first.setdefault(id(s.steps), s.k)
            for steps in made:
                if id(steps) in first:
                    steps.trim(first[id(steps)])
        rest = order[step[order] == len(ends)]
        self.open, self.open_n = ([allr.take(rest)], len(rest)) if len(rest) else ([], 0)

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
