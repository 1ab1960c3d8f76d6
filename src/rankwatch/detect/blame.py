"""Root cause across communicators: who waited on whom.

In each instance, the last rank to start its GPU work (on the reference clock)
made the others wait by its lead over the second-to-last, when that lead is
larger than the clock uncertainty between them. If that rank's own segment
before the op was a delay (a straggler hit, see straggler.py), it is the root;
otherwise its lateness was inherited: it waited on someone earlier in the same
step (since the last collective spanning every rank), and the blame follows
that last-arriver edge back to the root. Everyone who waited in such an
instance is a victim of the root, with the time they waited, and is not
reported as a straggler.

Vectorised: each instance points at its parent (the latest earlier blamed
instance its last rank took part in, in the same step), and roots are found by
pointer jumping.
"""

from __future__ import annotations

import numpy as np

from rankwatch.detect import kernels
from rankwatch.detect.base import Context, Window
from rankwatch.detect.cohorts import Cohorts
from rankwatch.detect.robust import run_heads, stable_order


class BlameDetector:
    def __init__(self, ctx: Context, min_lag_ns: float = 200e3) -> None:
        self.ctx = ctx
        self.min_lag_ns = min_lag_ns
        topo = ctx.topo
        n = topo.n_procs
        self.root = np.full(n, -1, dtype=np.int64)  # whose delay each process carries
        self.root_seg = np.full(n, -1, dtype=np.int64)  # ... and in which step
        self.segment = 0
        self.caused: dict[int, np.ndarray] = {}  # root -> wait caused per process (ns)
        self.comms: dict[int, np.ndarray] = {}  # root -> (process, communicator) waited in
        hosts = {h: i for i, h in enumerate(sorted({p.host for p in topo.procs}))}
        self.host_id = np.array([hosts[p.host] for p in topo.procs], dtype=np.int64)

    def feed(self, window: Window) -> None:
        c = window.cohorts
        if c is None or not len(c):
            return
        r = c.recs
        last, second = _top_two(np.nan_to_num(r.gstart_c, nan=-np.inf), c.inst, c.inst_start)
        order = np.arange(len(r))  # instances are contiguous already
        lag = r.gstart_c[last] - r.gstart_c[second]
        lp, sp = r.proc[last], r.proc[second]
        bound = self.ctx.topo.bound_ns
        unc = np.where(self.host_id[lp] == self.host_id[sp], 0.0, bound[lp] + bound[sp])
        sig = (c.inst_count >= 2) & (lag > np.fmax(self.min_lag_ns, 2 * unc))
        ends = np.fmax(r.gend_c[last], r.gend_c[second])
        world = self._world_ends(c, ends)
        seg = self.segment + np.searchsorted(world, ends, side="left")
        direct = sig & (r.sig[last] if "sig" in r else False)
        cand = np.flatnonzero(sig & (direct | (self.root_seg[lp] >= 0) | self._near(c, direct, lp)))
        if len(cand):
            cand = cand[np.argsort(ends[cand], kind="stable")]
            self._resolve(c, order, cand, lp, direct, seg, r.gstart_c[last[cand]])
        self.segment += len(world)
        self._publish()

    def _near(self, c: Cohorts, direct: np.ndarray, lp: np.ndarray) -> np.ndarray:
        """Instances whose last rank took part in a directly blamed one (a superset of
        those that can inherit blame in this window)."""
        if not direct.any():
            return np.zeros(len(lp), dtype=bool)
        touched = np.zeros(self.ctx.topo.n_procs, dtype=bool)
        touched[c.recs.proc[direct[c.inst]]] = True
        for _ in range(4):  # blame spreads to the members of inheriting instances
            grown = touched.copy()
            grown[c.recs.proc[touched[lp][c.inst]]] = True
            if np.array_equal(grown, touched):
                break
            touched = grown
        return touched[lp]

    def _resolve(self, c: Cohorts, order, cand, lp, direct, seg, g_last) -> None:
        """Root of each candidate instance (in end order), then the waits it caused."""
        r = c.recs
        k = len(cand)
        # members of the candidates: (proc, position of their instance)
        cnt = c.inst_count[cand]
        pos = np.repeat(np.arange(k), cnt)
        rec = order[
            np.repeat(c.inst_start[cand], cnt)
            + (np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        ]
        mproc = r.proc[rec].astype(np.int64)
        # parent: the latest earlier candidate (same step) the last rank was a member of
        key = mproc * (k + 1) + pos
        srt = stable_order(key, int(key.max()) + 1)
        q = (
            np.searchsorted(
                key[srt], lp[cand].astype(np.int64) * (k + 1) + np.arange(k), side="left"
            )
            - 1
        )
        q_ok = q >= 0
        qi = srt[np.maximum(q, 0)]
        parent = np.where(q_ok & (mproc[qi] == lp[cand]) & (pos[qi] < np.arange(k)), pos[qi], -1)
        parent = np.where(seg[cand][np.maximum(parent, 0)] == seg[cand], parent, -1)
        fixed = np.where(direct[cand], lp[cand], -1)
        carried = (parent < 0) & ~direct[cand] & (self.root_seg[lp[cand]] == seg[cand])
        fixed = np.where(carried, self.root[lp[cand]], fixed)
        root = _jump(parent, fixed)
        self._account(r, rec, pos, mproc, root, seg[cand], g_last)

    def _account(self, r, rec, pos, mproc, root, seg, g_last) -> None:
        ok = root[pos] >= 0
        wait = g_last[pos] - r.gstart_c[rec]
        victim = np.flatnonzero(ok & (mproc != root[pos]) & (wait > 0))
        # victims grouped by root, each group in its original order (so the sums are
        # the same however many roots there are): one sort, not a pass per root
        who = root[pos[victim]]
        by_root = np.argsort(who, kind="stable")
        victim, who = victim[by_root], who[by_root]
        heads = np.flatnonzero(run_heads(who)).tolist()
        ends = heads[1:] + [len(who)] if heads else []  # no victim: no group
        for a, b in zip(heads, ends, strict=True):
            w, mine = int(who[a]), victim[a:b]
            if w not in self.caused:
                n = self.ctx.topo.n_procs
                self.caused[w] = np.zeros(n)
                self.comms[w] = np.zeros((n, self.ctx.topo.n_comms), dtype=bool)
            np.add.at(self.caused[w], mproc[mine], wait[mine])
            self.comms[w][mproc[mine], r.comm[rec[mine]]] = True
        # each process now carries the root of the latest blamed instance it was in
        done = np.flatnonzero(ok)
        self.root[mproc[done]] = root[pos[done]]  # later positions overwrite earlier ones
        self.root_seg[mproc[done]] = seg[pos[done]]

    def _world_ends(self, c: Cohorts, ends: np.ndarray) -> np.ndarray:
        world = self.ctx.topo.world
        if world is None:
            return np.zeros(0)
        first = c.inst_start
        mask = (c.recs.comm[first] == world) & ~c.recs.p2p[first]
        return np.sort(ends[mask])

    def _publish(self) -> None:
        for (proc, _), cul in self.ctx.culprits.items():
            if proc in self.caused:
                waited = self.caused[proc]
                victims = np.flatnonzero(waited > 0)
                cul.victims = dict(zip(victims.tolist(), waited[victims].tolist(), strict=True))
                vs, cs = np.nonzero(self.comms[proc][victims])
                comms: dict[int, set[int]] = {int(v): set() for v in victims}
                for v, cm in zip(victims[vs].tolist(), cs.tolist(), strict=True):
                    comms[v].add(cm)
                cul.victim_comms = comms

    def findings(self) -> list:
        return []  # victims are part of their culprit's straggler finding


def _top_two(g: np.ndarray, inst: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Records of the latest and second-latest value of each contiguous instance (the
    latest itself when an instance has one record), without sorting: the first
    record of each instance that holds its largest value, then the first that holds
    the largest of the others."""
    got = kernels.top_two(g, start)
    if got is not None:
        return got
    top = np.maximum.reduceat(g, start)
    last = _first_of_each(np.flatnonzero(g == top[inst]), inst)  # every instance has one
    rest = g.copy()
    rest[last] = -np.inf
    top2 = np.maximum.reduceat(rest, start)
    at2 = np.flatnonzero((rest == top2[inst]) & np.isfinite(rest))
    second = last.copy()
    if len(at2):
        i2 = inst[at2]
        head = run_heads(i2)
        second[i2[head]] = at2[head]
    return last, second


def _first_of_each(at: np.ndarray, inst: np.ndarray) -> np.ndarray:
    """The first of the positions `at` (ascending) in each instance they fall in."""
    return at[run_heads(inst[at])]


def _jump(parent: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """Root of each node: its own `fixed` value, or its parent's root (-1: none)."""
    root = fixed.copy()
    up = np.where(fixed >= 0, -1, parent)
    while True:
        todo = up >= 0
        if not todo.any():
            return root
        root = np.where(todo, root[np.maximum(up, 0)], root)
        nxt = np.where(todo, up[np.maximum(up, 0)], -1)
        # stop where the parent is resolved (fixed) or has no parent
        up = np.where(todo & (root < 0), nxt, -1)
