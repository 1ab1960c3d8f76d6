"""Straggler (cause host or gpu): a rank whose own work before collectives grows.

Per class cohort, per stage and function (peers doing the same work), each
rank's local segment gap_g (prepare.py) is compared with the cohort median, in
robust sigmas. Stragglers are only ever late, so the scale comes from the early
side (median minus lower quartile) once a cohort has 8 ranks, and from the
MAD below that; several stragglers in one cohort then neither inflate it nor
hide each other. Comparing local segments, not arrival times, keeps victims
out: a rank that waited on a straggler and so arrives late at the next
collective has a normal segment there.

What is normal for a rank at a slot (a stage that always works longer, a rank
that is always a bit late at one op) is learned from its first `learn`
observations, shrunk toward zero by their uncertainty, and subtracted: a
finding is a change from that baseline.

Persistence, per (rank, slot), i.e. the same op in consecutive steps:
  runs    `persist` consecutive hits (residual above max(z_hit sigma, hit_ns,
          rel_hit x median segment)), or two when two in a row like them are
          unlikely by chance: few pairs of the kind's earlier late ops were as
          late and as alike in size (`chance_runs`; a clean job, or a delay
          unlike the job's usual stalls, is confirmed a step sooner);
  CUSUM   S = max(0, S + min(z, z_clip) - cusum_k) >= cusum_h, for delays
          below the hit threshold that persist (heavy noise);
and per rank, `persist_ops` consecutive hits over its ops (a delay on every op).
Pair cohorts (two ranks) have no majority to tell noise from a straggler, and
real two-rank jobs show millisecond swaps of who waits: they need
`pair_persist` steps (or twice the CUSUM threshold) at one slot. The per-rank
run is off for pairs by default: one late start of a step makes every later op
of that step look late (the peer waits and its segments shrink), so a single
slow step would fill it.
Noise, single outliers and small delays that rotate over ranks do not
persist. The onset is where the run (or the CUSUM excursion) that fired began.

Cause: host when the arrival (the API call) moved by at least host_share of
the GPU start; gpu when the arrival stayed put and the GPU start moved.
"""

from __future__ import annotations

import bisect

import numpy as np

from rankwatch.detect import kernels
from rankwatch.detect.base import Config, Context, Culprit, Window
from rankwatch.detect.cohorts import Cohorts
from rankwatch.detect.grid import Grid
from rankwatch.detect.prepare import SEQ_BITS
from rankwatch.detect.records import Recs
from rankwatch.detect.report import costly, render
from rankwatch.detect.robust import (
    MAD_SCALE,
    cusum_lazy,
    group_median,
    group_sorted,
    group_starts,
    run_heads,
    run_lengths,
    run_tails,
    segmented_ewma,
    sorted_median,
    stable_order,
    trailing_misses,
)
from rankwatch.detect.topology import FUNCS
from rankwatch.model import Finding

SAMPLE_OPS = 6
MAX_HIT_TIMES = 20000
CLUSTER_GAP = 8.0
MIN_CLUSTER = 10
PLATEAU = 10
MIN_PREFIX = 3
PERSIST_HINT = 3  # the late op of a cluster taken as its detection point
SIGMA_EWMA = 0.2
PAIR_EWMA = 0.05
PAIR_LEARN = 8
INLIER_PASSES = 8
CAUSE_HITS = 8  # late ops per (rank, slot) that decide the cause
Q_SCALE = 1 / 0.6745  # (median - lower quartile) -> standard deviation
LOWER_SIDE_MIN = 8
LOCAL = "local"  # culprit key for host/gpu stragglers; the cause is voted


def _slot_order(r: Recs, idx: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """idx sorted by (proc, slot, seq), and the (proc, slot) key.

    Records come sorted by cohort, and a cohort key orders one (proc, slot)'s ops
    by seq: a radix sort by (proc, slot) alone then gives the order, which one
    pass checks; an integer sort of (proc, slot, seq) otherwise."""
    flat = r.proc[idx].astype(np.int64) * width + r.slot[idx]
    seq = r.seq[idx]
    if not len(idx):
        return idx, flat
    order = stable_order(flat, int(flat.max()) + 1)
    f, q = flat[order], seq[order]
    if not np.all((q[1:] >= q[:-1]) | (f[1:] != f[:-1])):
        rel = seq - seq.min()
        order = np.argsort((flat << 24) | np.minimum(rel, (1 << 24) - 1), kind="stable")
        f = flat[order]
    return idx[order], f


def _time_order(r: Recs, idx: np.ndarray) -> np.ndarray:
    """idx sorted by (proc, GPU start to 16 ns), ties in their order: by time, then a
    radix sort by proc."""
    t = np.nan_to_num(r.gstart_c[idx], nan=0.0)
    rel = np.clip(t - (t.min() if len(t) else 0.0), 0, 2.0**40 - 1).astype(np.int64) >> 4
    n = len(idx)
    if not n:
        return idx
    if n < 1 << 27:  # unique keys (time, position): the fast unstable sort is stable
        by_time = np.argsort((rel << 27) | np.arange(n))
    else:
        by_time = np.argsort(rel, kind="stable")
    proc = r.proc[idx][by_time]
    return idx[by_time[stable_order(proc, int(proc.max()) + 1)]]


def _dense(keys: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids of keys in key order (those not ok share one id of their own, the
    first): a table of the keys present when they are small, as they are (cohort,
    stage, function), else np.unique."""
    k = np.where(ok, keys, -1)
    if len(k) and np.all(k[1:] >= k[:-1]):  # already in order, as without stages
        first = run_heads(k)
        return np.cumsum(first) - 1, int(first.sum())
    if len(k) and int(k.max()) < 8 * len(k) + 1024:
        present = np.zeros(int(k.max()) + 2, dtype=bool)
        present[k + 1] = True
        ids = np.cumsum(present) - 1
        return ids[k + 1], int(ids[-1]) + 1
    uniq, inv = np.unique(k, return_inverse=True)
    return inv.reshape(-1), len(uniq)


def _reference(x: np.ndarray, group: np.ndarray, n_groups: int, count: np.ndarray) -> np.ndarray:
    """Per group: the median, or the smaller value in a group of two."""
    ref = group_median(x, group, n_groups)
    if (count == 2).any():
        lo = np.full(n_groups, np.inf)
        np.fmin.at(lo, group, np.where(np.isfinite(x), x, np.inf))
        ref = np.where(count == 2, lo, ref)
    return ref


def _state_before(
    obs_key: np.ndarray, post: np.ndarray, query_key: np.ndarray, out: np.ndarray, n: int
) -> None:
    """out[i] = the state after the last observation of the same slot whose key is
    below query_key[i] (keys are slot * n + position in the batch; obs_key
    ascending); out keeps its value (the slot's state before the batch) where
    there is none."""
    if not len(obs_key):
        return
    pos = np.searchsorted(obs_key, query_key, side="left") - 1
    ok = pos >= 0
    ok[ok] = obs_key[pos[ok]] // n == query_key[ok] // n
    out[ok] = post[pos[ok]]


def _inlier_ewma(
    x: np.ndarray, seg: np.ndarray, init: np.ndarray, alpha: float, floor: float
) -> np.ndarray:
    """segmented_ewma over the inliers only (x at most 3 times the scale before it,
    or the floor), as one pass in order would take them; NaN for outliers.

    Which observations are inliers depends on the scale, which depends on the
    inliers: start from the scale each segment began with, and repeat until the
    choice no longer changes (a couple of passes: the scale moves slowly);
    should it not settle, walk the observations in order."""
    prior = init.copy()
    inl = np.zeros(len(x), dtype=bool)
    for done in range(INLIER_PASSES):
        now = x <= 3.0 * np.fmax(prior, floor)
        if done and np.array_equal(now, inl):
            break
        inl = now
        post = np.full(len(x), np.nan)
        post[inl] = segmented_ewma(x[inl], seg[inl], init[inl], alpha)
        prior = _priors(post, seg, init)
    else:
        return _inlier_ewma_walk(x, seg, init, alpha, floor)
    return post


def _priors(post: np.ndarray, seg: np.ndarray, init: np.ndarray) -> np.ndarray:
    """Per element: the state before it (the last finite post of earlier elements of
    its segment, else init)."""
    n = len(post)
    if not n:
        return init.copy()
    upto = np.maximum.accumulate(np.where(np.isfinite(post), np.arange(n), -1))
    before = np.r_[-1, upto[:-1]]
    ok = before >= group_starts(seg)
    return np.where(ok, post[np.maximum(before, 0)], init)


def _inlier_ewma_walk(
    x: np.ndarray, seg: np.ndarray, init: np.ndarray, alpha: float, floor: float
) -> np.ndarray:
    post = np.full(len(x), np.nan)
    cur, last = 0.0, None
    for i in range(len(x)):
        if seg[i] != last:
            cur, last = float(init[i]), seg[i]
        if x[i] <= 3.0 * max(cur, floor):
            cur += alpha * (float(x[i]) - cur)
            post[i] = cur
    return post


def _record_at(order: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The records at positions `pos` of `order`; negative positions kept (codes)."""
    return np.where(pos >= 0, order[np.maximum(pos, 0)] if len(order) else pos, pos)


def _last(group: np.ndarray) -> np.ndarray:
    return np.flatnonzero(run_tails(group))


def _onsets(r: Recs, order: np.ndarray, started: np.ndarray, carried: np.ndarray) -> np.ndarray:
    """(seq, ns, comm, func) where runs began: the record at position `started` of
    `order` in this batch (>= 0), else the carried start of a run that began earlier."""
    return _onsets_at(r, np.where(started >= 0, order[np.maximum(started, 0)], -1), carried)


def _onsets_at(r: Recs, rec: np.ndarray, carried: np.ndarray) -> np.ndarray:
    """_onsets for record indices (-1: carried)."""
    here = np.maximum(rec, 0)
    own = np.stack([r.seq[here], r.arrival_c[here], r.comm[here], r.func[here]], axis=1).astype(
        float
    )
    return np.where((rec >= 0)[:, None], own, carried)


def _time_keys(r: Recs, idx: np.ndarray) -> np.ndarray | None:
    """One integer per op whose order is _time_order's (proc, GPU start to 16 ns,
    position in idx), or None when proc, time and position do not fit 63 bits."""
    n = len(idx)
    if not n:
        return None
    t = np.nan_to_num(r.gstart_c[idx], nan=0.0)
    rel = np.clip(t - t.min(), 0, 2.0**40 - 1).astype(np.int64) >> 4
    proc = r.proc[idx].astype(np.int64)
    pb = max(n - 1, 1).bit_length()
    tb = max(int(rel.max()), 1).bit_length()
    if max(int(proc.max()), 1).bit_length() + tb + pb > 62 or int(proc.min()) < 0:
        return None
    return (proc << (tb + pb)) | (rel << pb) | np.arange(n)


def _runs_at_hits(keys: np.ndarray, proc: np.ndarray, hit: np.ndarray, carry_run, carry_miss):
    """run_lengths and trailing_misses over ops in the order of `keys` (unique), per
    proc, computed at the hits only (hits are rare): no sort of all the ops.

    Between two hits of a rank there is a miss when some op of that rank has a key
    between theirs; each op is located among the sorted hit keys by a binary search.
    Returns (procs present, the index into the hits of each one's last op when that
    is a hit else -1, each one's trailing misses, and per hit in key order: its op,
    its run, and the op where its run began, -1 when it began before these ops)."""
    n_p = int(proc.max()) + 1
    hj = np.flatnonzero(hit)
    hj = hj[np.argsort(keys[hj])]
    hk, hp = keys[hj], proc[hj]
    nh = len(hk)
    per_proc = np.bincount(proc, minlength=n_p)
    n_hits = np.bincount(hp, minlength=n_p)
    base = np.cumsum(n_hits) - n_hits  # each rank's first hit, in key order
    slot = np.searchsorted(hk, keys, side="right")  # hits at or before each op
    before = np.bincount(proc[slot == base[proc]], minlength=n_p)  # ops before its first hit
    after = np.bincount(proc[slot == (base + n_hits)[proc]], minlength=n_p)  # from its last hit
    procs = np.flatnonzero(per_proc)
    has = n_hits[procs] > 0
    miss = np.where(has, after[procs] - 1, per_proc[procs] + carry_miss[procs])
    last_hit = np.where(has & (after[procs] == 1), (base + n_hits - 1)[procs], -1)
    if not nh:
        empty = np.zeros(0, dtype=np.int64)
        return procs, last_hit, miss, empty, empty, empty
    between = np.bincount(slot, minlength=nh + 1)[:nh] - 1  # ops strictly between hits
    j = np.arange(nh)
    first = j == base[hp]
    block = first | (between > 0)
    begin = np.maximum.accumulate(np.where(block, j, 0))
    c = carry_run[hp]
    whole = first[begin] & (before[hp] == 0)  # back to the rank's first op here
    run = j - begin + 1 + np.where(whole, c, 0)
    started = np.where(whole & (c > 0), -1, hj[begin])
    return procs, last_hit, miss, hj, run, started


# what fired, per record: its run's onset (seq, ns, comm, func), then how it fired (a
# run of k late steps at one op: k; BY_CUSUM; BY_RANK_RUN) and, for two late steps, the
# chance pairs expected (see _few_chance)
_NONE_FIRED = (np.zeros(0, dtype=np.int64), np.zeros((0, 6)))
BY_CUSUM = -1.0
BY_RANK_RUN = -2.0
CHANCE_BINS = 128  # how late a late op is, in eighths of an octave of sigma


def _chance_bin(z: np.ndarray) -> np.ndarray:
    """Bins of z (sigma): 8 per doubling, from 1 sigma to 2^16."""
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.floor(8.0 * np.log2(np.fmax(np.nan_to_num(z, nan=1.0), 1.0)))
    return np.minimum(b, CHANCE_BINS - 1).astype(np.int64)


def _chance_pairs(hist: np.ndarray, b1: int, b2: int) -> float:
    """The ordered pairs of late ops in `hist` (late ops that began a run at their
    slot, by bin of _chance_bin, the pair's first among them) like the pair of bins b1
    then b2: both at least min(b1, b2) and at most |b1 - b2| + 1 bins apart. Over N
    ops that is N^2 times the chance that two ops in a row are such a pair, so / N the
    pairs expected by chance. Without the `apart` condition it is (B + 1)^2, B the
    earlier late ops at least as late as the smaller of the two (the rule before):
    noise stalls of every size make such pairs often, but two of nearly the same size
    (what a delay added every step makes) only as often as stalls of that size are
    common."""
    lo, apart = min(b1, b2), abs(b1 - b2) + 1
    h = hist[lo:].astype(np.float64)
    if not h.any():
        return 1.0
    at = np.arange(len(h))
    c = np.r_[0.0, np.cumsum(h)]  # near: late ops within `apart` bins of each bin
    near = c[np.minimum(at + apart + 1, len(h))] - c[np.maximum(at - apart, 0)]
    return float(np.dot(h, near))


def _fired_rows(
    onsets: np.ndarray, how: np.ndarray | float, chance: np.ndarray | float
) -> np.ndarray:
    """The rows of fired records: onsets with how they fired (see _NONE_FIRED)."""
    n = len(onsets)
    return np.c_[onsets, np.broadcast_to(how, n), np.broadcast_to(chance, n)]


def _confirmed_by(how: float, chance: float, pair: bool, config: Config) -> dict:
    """Plain words for how a straggler was confirmed (its finding's evidence)."""
    if how == BY_CUSUM:
        threshold = 2 * config.cusum_h if pair else config.cusum_h
        return {"rule": "cumulative lateness (CUSUM) at one op", "cusum_threshold": threshold}
    if how == BY_RANK_RUN:
        return {"rule": "late ops in a row", "late_ops": config.persist_ops}
    out: dict = {"rule": "late steps in a row at one op", "late_steps": int(how)}
    if pair:
        out["note"] = "two-rank cohort: more late steps needed"
    elif np.isfinite(chance):
        out["chance_pairs_expected"] = round(float(chance), 5)
        out["note"] = (
            "two sufficed: so few of the job's earlier late ops of this kind were as late "
            "and as alike in size that two in a row like them by chance are unlikely"
        )
    return out


def _merge_fired(idx: np.ndarray, onset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Records that fired by either persistence rule, once each, with the earlier onset."""
    if not len(idx):
        return _NONE_FIRED
    order = np.lexsort((onset[:, 1], idx))
    first = run_heads(idx[order])
    keep = order[first]
    return idx[keep], onset[keep]


class StragglerDetector:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        learn = ctx.config.learn
        n = ctx.topo.n_procs
        spec = {
            "nobs": (np.int64, 0, 0),
            "base": (np.float64, 0.0, 0),
            "learn": (np.float64, np.nan, learn),
            "learn_sig": (np.float64, np.nan, learn),
            "run": (np.int64, 0, 0),
            "cusum": (np.float64, 0.0, 0),
            "run_at": (np.float64, -1.0, 4),
            "cusum_at": (np.float64, -1.0, 4),
            "last_z": (np.float64, 0.0, 0),
        }
        self.grid = Grid(n, spec)
        self.sig_slot = np.zeros(0)
        self.pair_sig = np.zeros(0)  # pair cohorts' typical difference, per slot
        self.pair_learn: dict[int, list[float]] = {}
        self.prun = np.zeros(n, dtype=np.int64)  # per-rank run over consecutive ops
        self.prun_at = np.full((n, 4), -1.0)
        self.votes = np.zeros((n, 2), dtype=np.int64)  # host, gpu
        self.slot_excess = np.zeros((n, 0, 2))  # per rank and slot: host, gpu excess (ns)
        self.slot_hits = np.zeros((n, 0), dtype=np.int64)
        self.miss = np.zeros(n, dtype=np.int64)  # judged ops since the rank's last hit
        self.ep_miss = np.zeros(n, dtype=np.int64)  # ... since its last hit or firing op
        self.kind_of = np.zeros(0, dtype=np.int64)  # sym -> kind (-1: none yet)
        self.kind_n = np.zeros(0, dtype=np.int64)  # judged records per kind
        # ... and late ops that began a run at their slot, by how late (_chance_bin)
        self.kind_hist = np.zeros((0, CHANCE_BINS), dtype=np.int64)

    # ------------------------------------------------------------------ feed
    def feed(self, window: Window) -> None:
        c = window.cohorts
        if c is None:
            return
        r, cfg = c.recs, self.ctx.config
        self.grid.ensure(self.ctx.slots.size)
        if len(self.sig_slot) < self.ctx.slots.size:
            grow = np.zeros(self.ctx.slots.size - len(self.sig_slot))
            self.sig_slot = np.r_[self.sig_slot, grow]
            self.pair_sig = np.r_[self.pair_sig, grow]
        excess, sg, n_sg, sigma, ref, ok = self._cohort_stats(c)
        floor = np.maximum(cfg.hit_ns, cfg.rel_hit * np.abs(np.nan_to_num(ref)))[sg]
        slots = self._slot_state(r, excess, sigma, np.maximum(cfg.z_hit * sigma, floor), ok)
        resid, hit = slots["resid"], slots["hit"]
        judged = np.isfinite(resid)
        excess_h = self._host_excess(r, sg, n_sg, ok, hit)
        host = hit & (excess_h >= cfg.host_share * excess)
        z = resid / sigma
        r.resid, r.hit, r.sigma, r.excess_h = resid, hit, sigma, excess_h
        r.sig = judged & (resid > 3 * sigma) & (resid > cfg.hit_ns / 2)
        r.d_gap = np.where(r.sig, resid, 0.0)
        np.add.at(self.votes[:, 0], r.proc[host], 1)
        np.add.at(self.votes[:, 1], r.proc[hit & ~host], 1)
        self._slot_cause(r, hit, host, resid)
        at_slot, onset_slot = self._slot_fired(r, slots, judged, z)
        at_rank, onset_rank = self._rank_persistence(r, judged, hit)
        fired, onset = _merge_fired(
            np.r_[at_slot, at_rank], np.concatenate([onset_slot, onset_rank])
        )
        # a firing op is evidence of a slowdown going on only if it is itself clearly
        # late (r.sig, 3 sigma): a CUSUM fires on for dozens of steps after a slowdown
        # ends, while its ops are ordinary
        live = hit[fired] | r.sig[fired]
        self._episodes(r, judged, hit, fired[live], onset[live])
        self._accumulate(r, z)

    def _slot_cause(self, r: Recs, hit, host, resid) -> None:
        """Excess per (rank, slot) and cause over the first CAUSE_HITS late ops at each
        slot. The cause of a finding is that of the op where most of the delay
        appears (see _cause): after a rank starts a step late, its peers wait inside
        their ops and their segments shrink, so the rank's later ops of the step
        look late by their ordinary work, a GPU pattern, whatever delayed the step.
        Only the first late ops count: a slowdown that lasts changes what is around
        it (a GPU far behind fills the launch queue and holds the host back too),
        and the onset shows the cause most plainly."""
        n, n_slots = self.slot_excess.shape[0], self.ctx.slots.size
        if self.slot_excess.shape[1] < n_slots:
            extra = n_slots - self.slot_excess.shape[1]
            self.slot_excess = np.concatenate([self.slot_excess, np.zeros((n, extra, 2))], axis=1)
            self.slot_hits = np.concatenate(
                [self.slot_hits, np.zeros((n, extra), dtype=np.int64)], axis=1
            )
        idx = np.flatnonzero(hit & (r.slot < n_slots))
        if not len(idx):
            return
        idx = idx[np.lexsort((r.seq[idx], r.slot[idx], r.proc[idx]))]
        p, sl = r.proc[idx], r.slot[idx]
        first = np.r_[True, (p[1:] != p[:-1]) | (sl[1:] != sl[:-1])]
        start = np.maximum.accumulate(np.where(first, np.arange(len(idx)), 0))
        count = self.slot_hits[p, sl] + (np.arange(len(idx)) - start)
        early = count < CAUSE_HITS
        cause = np.where(host[idx], 0, 1)
        np.add.at(self.slot_excess, (p[early], sl[early], cause[early]), resid[idx][early])
        np.add.at(self.slot_hits, (p, sl), 1)

    def _cause(self, proc: int) -> str:
        per_slot = self.slot_excess[proc] if self.slot_excess.shape[1] else None
        if per_slot is None or not per_slot.any():
            host, gpu = self.votes[proc]
            return "host" if host > gpu else "gpu"
        top = per_slot[int(np.argmax(per_slot.sum(axis=1)))]
        return "host" if top[0] > top[1] else "gpu"

    def _cohort_stats(self, c: Cohorts):
        """Excess of gap_g (and gap_h) over the reference of its stats group, and sigma.

        The reference is the group's median; in a group of two (a two-rank job) the
        median is the mean, so each rank would be half late: there the reference
        is the earlier rank, and the scale is the pair's typical difference learned
        from their history (see _pair_sigma)."""
        r, cfg = c.recs, self.ctx.config
        ok = np.isfinite(r.gap_g) & ~r.misaligned & ~c.partial[c.gid]
        stages = int(r.stage.max()) + 1 if len(r) else 1
        sg, n_sg = _dense((c.gid * stages + r.stage) * 8 + r.func, ok)
        x = np.where(ok, r.gap_g, np.nan)
        v, vg, start, count = group_sorted(x, sg, n_sg)  # one sort serves both medians
        cnt = count[sg]
        pair = cnt == 2
        ref, _ = sorted_median(v, vg, start, count)
        two = count == 2
        if two.any():  # a pair's reference is its earlier rank
            ref = np.where(two, v[np.minimum(start, len(v) - 1)], ref)  # two values: len(v) > 0
        dev = x - ref[sg]
        # scale: MAD; from 8 ranks on one-sided (the early half's median distance is
        # 0.6745 sigma), which late ranks cannot inflate
        scale = np.where(count >= LOWER_SIDE_MIN, Q_SCALE, MAD_SCALE) * self._spread(
            v, vg, start, count, ref, dev, sg, n_sg
        )
        ok &= (cnt >= cfg.min_cohort) | pair
        sig_c = scale[sg]
        g_slot = np.zeros(n_sg, dtype=np.int64)
        g_slot[sg] = r.slot
        many_g = np.zeros(n_sg, dtype=bool)
        many_g[sg[ok & ~pair]] = True
        # a cohort's own scale is noisy (a few ranks); the slot's typical scale is not
        typical = self._typical_scale(g_slot, scale, many_g)[sg]
        sigma = np.fmax(
            np.where(typical > 0, 0.5 * (np.nan_to_num(sig_c) + typical), sig_c), cfg.sigma_floor_ns
        )
        self._pair = pair
        if pair.any():
            sigma = np.where(pair, self._pair_sigma(r.slot, dev, ok & pair, sg, n_sg), sigma)
        excess = np.where(ok, dev, np.nan)
        return excess, sg, n_sg, sigma, ref, ok

    def _typical_scale(self, g_slot: np.ndarray, scale: np.ndarray, many: np.ndarray) -> np.ndarray:
        """Per stats group: its slot's typical cohort scale from the cohorts before it
        (0 while there are none): an EWMA over the slot's cohorts, one update per
        cohort, so that neither the batch a cohort arrives in nor later cohorts
        change how it is judged."""
        n_sg = len(g_slot)
        order = np.argsort(g_slot, kind="stable")  # by slot, then cohort order
        obs = order[many[order] & np.isfinite(scale[order])]
        prior = self.sig_slot[g_slot].copy()
        if not len(obs):
            return prior
        o_slot = g_slot[obs]
        init = self.sig_slot[o_slot]
        post = segmented_ewma(scale[obs], o_slot, np.where(init > 0, init, np.nan), SIGMA_EWMA)
        _state_before(o_slot * n_sg + obs, post, g_slot * n_sg + np.arange(n_sg), prior, n_sg)
        tails = run_tails(o_slot)
        self.sig_slot[o_slot[tails]] = post[tails]
        return prior

    def _pair_sigma(
        self, slot: np.ndarray, dev: np.ndarray, pair: np.ndarray, sg: np.ndarray, n_sg: int
    ) -> np.ndarray:
        """Sigma of pair cohorts: the slot's typical |difference| between the two
        ranks (median |X1 - X0| is 0.954 sigma for normal noise) before the cohort:
        the running median of its first PAIR_LEARN observations (robust to warm-up
        steps), then an EWMA, one update per cohort, of inliers only, so that a
        straggler's own delays never become the scale that hides it."""
        floor = self.ctx.config.sigma_floor_ns
        recs = np.flatnonzero(pair)
        out = np.fmax(self.pair_sig[slot], floor)
        key = slot.astype(np.int64) * n_sg + sg
        obs = np.flatnonzero(pair & (dev > 0))  # one per pair: the later rank's difference
        obs = obs[np.argsort(key[obs], kind="stable")]
        before = self.pair_sig.copy()
        est = np.abs(dev[obs]) / 0.954
        o_slot = slot[obs]
        post = np.full(len(obs), np.nan)
        learning = self._pair_learning(o_slot, est, post)
        rest = np.flatnonzero(~learning)
        if len(rest):
            r_slot = o_slot[rest]
            r_post = _inlier_ewma(est[rest], r_slot, self.pair_sig[r_slot], PAIR_EWMA, floor)
            post[rest] = r_post  # NaN for outliers: they leave the scale as it was
            kept = np.isfinite(r_post)
            if kept.any():
                k_slot = r_slot[kept]
                tails = run_tails(k_slot)
                self.pair_sig[k_slot[tails]] = r_post[kept][tails]
        known = np.isfinite(post)
        prior = before[slot[recs]]
        _state_before(key[obs][known], post[known], key[recs], prior, n_sg)
        out[recs] = np.fmax(prior, floor)
        return out

    def _pair_learning(self, o_slot: np.ndarray, est: np.ndarray, post: np.ndarray) -> np.ndarray:
        """The observations that are among their slot's first PAIR_LEARN, with the
        running median after each written to post; the slot's scale set from them."""
        learning = np.zeros(len(o_slot), dtype=bool)
        if not len(o_slot):
            return learning
        heads = np.flatnonzero(run_heads(o_slot))
        ends = np.r_[heads[1:], len(o_slot)]
        for h, e in zip(heads.tolist(), ends.tolist(), strict=True):
            s = int(o_slot[h])
            seen = self.pair_learn.setdefault(s, [])
            if len(seen) >= PAIR_LEARN:
                continue
            for j in range(h, min(e, h + PAIR_LEARN - len(seen))):
                seen.append(float(est[j]))
                post[j] = float(np.median(seen))
                learning[j] = True
            self.pair_sig[s] = float(np.median(seen))
        return learning

    @staticmethod
    def _host_excess(
        r: Recs, sg: np.ndarray, n_sg: int, ok: np.ndarray, wanted: np.ndarray
    ) -> np.ndarray:
        """gap_h over its stats group's median, computed for the groups of `wanted` only."""
        out = np.full(len(r), np.nan)
        groups = np.unique(sg[wanted])
        if not len(groups):
            return out
        sel = np.flatnonzero(np.isin(sg, groups) & ok)
        local = np.searchsorted(groups, sg[sel])
        count = np.bincount(local, minlength=len(groups))
        # Only the part of gap_h after the previous op's end can have delayed the
        # GPU: a host that calls while the GPU is still busy (gap_h < 0) is ahead,
        # however much later than its peer's host it calls.
        waited = np.maximum(r.gap_h[sel], 0.0)
        ref = _reference(waited, local, len(groups), count)
        out[sel] = waited - ref[local]
        return out

    @staticmethod
    def _spread(v, vg, start, count, ref, dev, sg, n_sg) -> np.ndarray:
        """Per stats group: the median distance from the reference, over the early
        side (values at or below it) from LOWER_SIDE_MIN ranks on, else over all.

        The early side of a large group is the start of its sorted values (v, from
        group_sorted), whose distances ref - v are those values reversed: their
        median is read off by position, without sorting them again."""
        out = np.full(n_sg, np.nan)
        big = count >= LOWER_SIDE_MIN
        if big.any():
            m = np.bincount(vg[v <= ref[vg]], minlength=n_sg)[big]
            base = start[big] + m - 1
            a, b = base - (m - 1) // 2, base - m // 2
            rb = ref[big]
            out[big] = 0.5 * ((rb - v[a]) + (rb - v[b]))
        small = (count > 0) & ~big
        if small.any():
            sel = np.flatnonzero(small[sg])
            out[small] = group_median(np.abs(dev[sel]), sg[sel], n_sg)[small]
        return out

    # ------------------------------------------------------------------ baseline
    def _slot_state(self, r: Recs, excess, sigma, thr, ok) -> dict[str, np.ndarray]:
        """Per (rank, slot): the residual over its baseline (_baseline), whether it is
        late (over thr), and its runs and CUSUM (_slot_runs): resid, hit and head
        (a late op that begins a run) per record, and the records that may fire
        with their runs, sums and onsets. One pass in the compiled kernel when the
        batch gives each (rank, slot)'s ops in seq order, else in NumPy (the same
        numbers: tests/detect/test_kernels.py)."""
        g, cfg = self.grid, self.ctx.config
        low_run, low_s = self._low()
        cols = {"flat": r.proc.astype(np.int64) * g.width + r.slot, "ok": ok, "seq": r.seq,
                "excess": excess, "sigma": sigma, "thr": thr, "comm": r.comm,
                "func": r.func, "arrival_c": r.arrival_c}  # fmt: skip
        state = {k: g[k] for k in kernels.SLOT_STATE}
        got = kernels.slot_state(
            cols, state, cfg.learn, cfg.cusum_clip, cfg.cusum_k, low_run, low_s
        )
        if got is not None:
            return got
        resid = self._baseline(r, excess, sigma, ok)
        judged = np.isfinite(resid)
        hit = judged & (resid > thr)
        return self._slot_runs(r, judged, hit, resid / sigma) | {"resid": resid, "hit": hit}

    def _low(self) -> tuple[int, float]:
        """What may fire: the lower of the pair and non-pair thresholds of a run and
        of the CUSUM (_slot_fired applies the exact test)."""
        cfg = self.ctx.config
        low_run = min(cfg.persist, cfg.pair_persist, 2 if cfg.chance_runs > 0 else cfg.persist)
        return low_run, min(cfg.cusum_h, 2 * cfg.cusum_h)

    def _baseline(self, r: Recs, excess, sigma, ok) -> np.ndarray:
        """Residual over the (proc, slot) baseline; NaN while that baseline is learned.

        The baseline is the median of the first `learn` excesses, shrunk toward 0
        by two standard errors: only a consistent offset is taken as normal."""
        g, learn = self.grid, self.ctx.config.learn
        order, flat = _slot_order(r, np.flatnonzero(ok), g.width)
        self._order = (order, flat)  # reused by _slot_runs
        nobs = g["nobs"].reshape(-1)  # a view: [proc, slot] at proc * width + slot
        start = group_starts(flat)
        k = nobs[flat] + (np.arange(len(flat)) - start)
        learning = k < learn
        if learning.any():
            at = order[learning]
            p, s, kk = r.proc[at], r.slot[at], k[learning]
            g["learn"][p, s, kk] = excess[at]
            g["learn_sig"][p, s, kk] = sigma[at]
        heads = np.flatnonzero(start == np.arange(len(flat)))
        nobs[flat[heads]] += np.diff(heads, append=len(flat))  # records per (proc, slot)
        done = np.unique(flat[learning & (k == learn - 1)])
        if len(done):
            dp, ds = done // g.width, done % g.width
            m = np.nanmedian(g["learn"][dp, ds], axis=1)
            se = 2 * np.nanmedian(g["learn_sig"][dp, ds], axis=1) / np.sqrt(learn)
            g["base"][dp, ds] = np.sign(m) * np.maximum(np.abs(m) - se, 0.0)
        resid = np.full(len(r), np.nan)
        judged = order[~learning]
        resid[judged] = excess[judged] - g["base"].reshape(-1)[flat[~learning]]
        return resid

    # ------------------------------------------------------------------ persistence
    def _slot_runs(self, r: Recs, judged, hit, z) -> dict[str, np.ndarray]:
        """Runs of hits and a CUSUM per (proc, slot), in NumPy (the kernel's
        reference): head per record, and for the records that may fire (_low)
        their run, S, where the run and the excursion began (a record; -1: in an
        earlier batch, whose onset is in `carried`; -2: S is 0), the z of the op
        before at the slot (z1) and the slot's carried onsets (run, then CUSUM)."""
        g, cfg = self.grid, self.ctx.config
        order, flat = self._order  # the baseline's (proc, slot, seq) order, judged ones
        keep = judged[order]
        order, flat = order[keep], flat[keep]
        first = run_heads(flat)
        grp = np.cumsum(first) - 1
        uniq = flat[first]  # [proc, slot] of each group, flat (views below)
        g_run, g_cusum = g["run"].reshape(-1), g["cusum"].reshape(-1)
        g_run_at, g_cusum_at = g["run_at"].reshape(-1, 4), g["cusum_at"].reshape(-1, 4)
        g_last_z = g["last_z"].reshape(-1)  # z of the last op when it was late
        last = _last(grp)
        gstart = group_starts(grp)
        run, started = run_lengths(hit[order], grp, g_run[uniq], gstart)
        # z is finite here (judged: a finite residual over a sigma of at least its floor)
        step = np.minimum(z[order], cfg.cusum_clip) - cfg.cusum_k
        s, began_at = cusum_lazy(step, grp, g_cusum[uniq], gstart)
        carried_run, carried_cusum = g_run_at[uniq], g_cusum_at[uniq]  # copies
        low_run, low_s = self._low()
        fired = np.flatnonzero((run >= low_run) | (s >= low_s))
        head = np.zeros(len(r), dtype=bool)
        head[order] = hit[order] & (run == 1)  # late ops not following one at their slot
        before = np.maximum(fired - 1, 0)
        out = {
            "head": head,
            "rec": order[fired],
            "run": run[fired],
            "s": s[fired],
            "run_start": _record_at(order, started[fired]),
            "cusum_start": _record_at(order, began_at(fired)),
            "z1": np.where(gstart[fired] < fired, z[order[before]], g_last_z[uniq[grp[fired]]]),
            "carried": np.c_[carried_run[grp[fired]], carried_cusum[grp[fired]]],
        }
        g_run[uniq], g_cusum[uniq] = run[last], s[last]
        g_run_at[uniq] = np.where(
            run[last, None] > 0, _onsets(r, order, started[last], carried_run), -1.0
        )
        g_cusum_at[uniq] = np.where(
            s[last, None] > 0, _onsets(r, order, began_at(last), carried_cusum), -1.0
        )
        g_last_z[uniq] = np.where(run[last] > 0, z[order[last]], 0.0)
        return out

    def _slot_fired(
        self, r: Recs, slots: dict[str, np.ndarray], judged, z
    ) -> tuple[np.ndarray, np.ndarray]:
        """The records that fired at their slot (a run or the CUSUM, see _slot_state)
        and the onset (seq, ns, comm, func) of the run or excursion each ends."""
        cfg = self.ctx.config
        rec, run, s = slots["rec"], slots["run"], slots["s"]
        judged_rec, head_rec = np.flatnonzero(judged), np.flatnonzero(slots["head"])
        pair = self._pair[rec]
        need = np.where(pair, cfg.pair_persist, cfg.persist)
        chance = np.full(len(rec), np.nan)
        two = np.flatnonzero((run == 2) & ~pair & ~r.p2p[rec])
        if len(two) and cfg.persist > 2:
            at = rec[two]
            few, chance[two] = self._few_chance(
                r, judged_rec, head_rec, z, at, slots["z1"][two], z[at]
            )
            need[two] = np.where(few, 2, cfg.persist)
        self._count_chance(r, judged_rec, head_rec, z)
        by_run = run >= need
        by_s = s >= np.where(pair, 2 * cfg.cusum_h, cfg.cusum_h)
        keep = np.flatnonzero(by_run | by_s)
        if not len(keep):
            return _NONE_FIRED
        by_run, carried = by_run[keep], slots["carried"][keep]
        at_run = _onsets_at(r, slots["run_start"][keep], carried[:, :4])
        at_cusum = _onsets_at(r, slots["cusum_start"][keep], carried[:, 4:])
        onset = np.where(by_run[:, None], at_run, at_cusum)
        how = np.where(by_run, run[keep], BY_CUSUM)
        return rec[keep], _fired_rows(onset, how, np.where(by_run, chance[keep], np.nan))

    def _few_chance(
        self,
        r: Recs,
        judged_rec: np.ndarray,
        head_rec: np.ndarray,
        z: np.ndarray,
        at: np.ndarray,
        z1: np.ndarray,
        z2: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Whether two late steps in a row at the slot of each record `at` (the
        second, of z z2; the first of z z1) are unlikely to be chance, by the ops of
        its kind before its cohort: N judged (of judged_rec here), and the late ops
        that began a run at their slot (head_rec here) by how late (CHANCE_BINS),
        this pair's first among them. Two late ops in a row by chance at least as
        late as the smaller of the two and as alike in size are expected
        _chance_pairs / N times; while that is at most chance_runs they are
        unlikely (Config). Counted per kind in sequence order, earlier batches'
        records carried, so the answer does not depend on how the stream was cut.
        Also returns the chance pairs expected."""
        # a collective's cohort key is its kind's code above SEQ_BITS and its seq below
        # (prepare.cohort_keys): the records of a kind before a cohort are a key range
        k_all = np.sort(r.key[judged_rec])
        h_rec = head_rec[np.argsort(r.key[head_rec], kind="stable")]
        h_key, h_bin = r.key[h_rec], _chance_bin(z[h_rec])
        kind = self._kinds(r.sym[at].astype(np.int64))
        b1s, b2s = _chance_bin(z1).tolist(), _chance_bin(z2).tolist()
        out = np.zeros(len(at), dtype=bool)
        expect = np.full(len(at), np.inf)
        for j, k in enumerate(r.key[at].tolist()):
            c = int(kind[j])
            lo = (k >> SEQ_BITS) << SEQ_BITS
            n = int(self.kind_n[c]) + int(np.searchsorted(k_all, k) - np.searchsorted(k_all, lo))
            a, e = np.searchsorted(h_key, lo), np.searchsorted(h_key, k)
            hist = self.kind_hist[c] + np.bincount(h_bin[a:e], minlength=CHANCE_BINS)
            expect[j] = _chance_pairs(hist, b1s[j], b2s[j]) / max(n, 1)
            out[j] = expect[j] <= self.ctx.config.chance_runs
        return out, expect

    def _kinds(self, sym: np.ndarray) -> np.ndarray:
        """Dense kind numbers of op kinds (sym), new ones added: the per-kind counts
        stay as small as the kinds a job has, however large its sym codes."""
        top = int(sym.max()) + 1 if len(sym) else 0
        if top > len(self.kind_of):
            self.kind_of = np.r_[self.kind_of, np.full(top - len(self.kind_of), -1, np.int64)]
        new = np.unique(sym[self.kind_of[sym] < 0])
        if len(new):
            self.kind_of[new] = len(self.kind_n) + np.arange(len(new))
            self.kind_n = np.r_[self.kind_n, np.zeros(len(new), np.int64)]
            self.kind_hist = np.concatenate(
                [self.kind_hist, np.zeros((len(new), CHANCE_BINS), np.int64)]
            )
        return self.kind_of[sym]

    def _count_chance(self, r: Recs, judged_rec, head_rec, z: np.ndarray) -> None:
        """Judged records, and late ops that began a run by how late, per kind (for
        _few_chance). Counted per sym code first: one bincount, no per-record lookup."""
        if not len(judged_rec):
            return
        per_sym = np.bincount(r.sym[judged_rec])
        present = np.flatnonzero(per_sym)
        kinds = self._kinds(present)  # may grow kind_n: before indexing it
        self.kind_n[kinds] += per_sym[present]
        if len(head_rec):
            kind = self._kinds(r.sym[head_rec].astype(np.int64))
            np.add.at(self.kind_hist, (kind, _chance_bin(z[head_rec])), 1)

    def _rank_persistence(self, r: Recs, judged, hit) -> tuple[np.ndarray, np.ndarray]:
        """Runs of consecutive hits per rank over its ops in time order: as _slot_runs.
        The compiled kernel, else NumPy at the hits (_runs_at_hits), else a sort of
        the ops (keys too wide for 63 bits); all three end in _rank_fired."""
        cfg = self.ctx.config
        idx = np.flatnonzero(judged)
        pair_ops = cfg.pair_persist_ops or np.iinfo(np.int64).max
        need = (cfg.persist_ops, pair_ops)
        keys = None
        if cfg.persist_ops > 0 and pair_ops > 0:
            got = kernels.rank_runs(
                idx, r.proc, r.gstart_c, hit, self._pair, *need, self.prun, self.miss
            )
            if got is not None:
                return self._rank_fired(r, *got)
            keys = _time_keys(r, idx)
        if keys is None:
            return self._rank_fired(r, *self._rank_runs_sorted(r, idx, hit, need))
        runs = _runs_at_hits(keys, r.proc[idx].astype(np.int64), hit[idx], self.prun, self.miss)
        procs, last_hit, miss, h_rec, h_run, h_start = runs
        h_rec = idx[h_rec]
        h_start = np.where(h_start >= 0, idx[np.maximum(h_start, 0)], -1)
        self.miss[procs] = miss
        # a rank whose last op here is a hit carries its run into the next window
        ends_hit = last_hit >= 0
        tail = np.full(len(self.prun), -3, dtype=np.int64)
        tail[procs] = -2
        tail[procs[ends_hit]] = h_start[last_hit[ends_hit]]
        self.prun[procs] = 0
        self.prun[procs[ends_hit]] = h_run[last_hit[ends_hit]]
        fired = h_run >= np.where(self._pair[h_rec], need[1], need[0])
        return self._rank_fired(r, tail, h_rec[fired], h_run[fired], h_start[fired])

    def _rank_fired(self, r: Recs, tail, rec, run, start) -> tuple[np.ndarray, np.ndarray]:
        """_rank_persistence from the runs found (prun and miss updated): per rank the
        start of the run its last op ends (-1: carried; -2: no run; -3: no op here),
        and the records that fired with the starts of their runs. Sets each rank's
        carried onset; returns the records that fired with theirs."""
        present = np.flatnonzero(tail > -3)
        carried = self.prun_at.copy()
        going = present[tail[present] >= -1]
        self.prun_at[present[tail[present] == -2]] = -1.0
        self.prun_at[going] = _onsets_at(r, tail[going], carried[going])
        if not len(rec):
            return _NONE_FIRED
        onset = _onsets_at(r, start, carried[r.proc[rec]])
        return rec, _fired_rows(onset, BY_RANK_RUN, np.nan)

    def _rank_runs_sorted(self, r: Recs, idx: np.ndarray, hit, need: tuple[int, int]):
        """_rank_persistence's runs by a sort of the ops, as _rank_fired takes them."""
        order = _time_order(r, idx)
        p = r.proc[order]
        run, started = run_lengths(hit[order], p, self.prun)
        last, miss = trailing_misses(hit[order], p, self.miss)
        self.miss[p[last]] = miss
        self.prun[p[last]] = run[last]
        start = _record_at(order, started)  # -1: the run began in an earlier batch
        tail = np.full(len(self.prun), -3, dtype=np.int64)
        tail[p[last]] = np.where(run[last] > 0, start[last], -2)
        fired = np.flatnonzero(run >= np.where(self._pair[order], need[1], need[0]))
        return tail, order[fired], run[fired], start[fired]

    # ------------------------------------------------------------------ culprits
    def _episodes(self, r: Recs, judged, hit, fired: np.ndarray, onset: np.ndarray) -> None:
        """Episodes of slowness per rank, op by op in time order: one begins at a record
        that fires (and is itself clearly late) while the rank has none going, and ends
        once episode_gap_ops of the rank's ops in a row show no evidence, neither late
        nor firing so (a slowdown found by its CUSUM fires op after op while it lasts,
        with few ops over the late threshold). Walking the late and firing ops of the
        ranks that fired (few), the ops between counted, not visited, gives the same
        episodes however the stream is cut into batches."""
        gap = self.ctx.config.episode_gap_ops
        n = self.ctx.topo.n_procs
        ops = np.bincount(r.proc[judged], minlength=n)
        had_hit = np.bincount(r.proc[judged & hit], minlength=n) > 0
        before = self.ep_miss
        # ranks without a firing op here: the misses since their last late op
        self.ep_miss = np.where(had_hit, self.miss, before + ops)
        walked = np.unique(r.proc[fired]).tolist() if len(fired) else []
        trail = self._walk(r, judged, hit, fired, onset, walked, before, gap)
        for p, miss in trail.items():
            self.ep_miss[p] = miss
        hits = np.flatnonzero(judged & hit)
        last_hit = np.full(n, -np.inf)
        if len(hits):
            np.maximum.at(last_hit, r.proc[hits], r.arrival_c[hits])
        for (p, kind), cul in self.ctx.culprits.items():
            if kind != LOCAL or p in trail:
                continue
            if last_hit[p] > cul.extra.get("evidence_ns", -np.inf):
                cul.extra["evidence_ns"] = float(last_hit[p])
            if cul.extra["active"] and self.ep_miss[p] >= gap:
                cul.extra["active"] = False
                cul.extra["ended_ns"] = cul.extra.get("evidence_ns", -np.inf)

    def _walk(self, r: Recs, judged, hit, fired, onset, walked, before, gap) -> dict[int, int]:
        """_episodes for the ranks that fired here: confirms new episodes, sets whether
        each is still going; returns each one's misses in a row at the end."""
        if not walked:
            return {}
        sel = np.flatnonzero(judged & np.isin(r.proc, walked))
        order = _time_order(r, sel)
        pos = np.arange(len(order)) - group_starts(r.proc[order])
        where = np.full(len(r), -1, dtype=np.int64)
        where[order] = pos
        fire_at = np.full(len(r), -1, dtype=np.int64)
        fire_at[fired] = np.arange(len(fired))
        events = order[hit[order] | (fire_at[order] >= 0)]
        local = {p: c for (p, kind), c in self.ctx.culprits.items() if kind == LOCAL}
        # per rank: in an episode, misses in a row, position of its last event, time of
        # its last evidence, when its previous episode ended (its last evidence then)
        state = {
            p: [
                p in local and bool(local[p].extra["active"]),
                int(before[p]),
                -1,
                local[p].extra.get("evidence_ns", -np.inf) if p in local else -np.inf,
                local[p].extra.get("ended_ns", -np.inf) if p in local else -np.inf,
            ]
            for p in walked
        }
        confirmed: list[tuple[int, int, np.ndarray]] = []
        arrival = r.arrival_c
        for i, p in zip(events.tolist(), r.proc[events].tolist(), strict=True):
            st = state[p]
            at = int(where[i])
            st[1] += at - st[2] - 1
            st[2] = at
            if st[0] and st[1] >= gap:
                st[0], st[4] = False, st[3]
            k = int(fire_at[i])
            # a run or CUSUM excursion that began before the previous episode ended (a
            # CUSUM still high from it) is not a new slowdown
            if k >= 0 and not st[0] and onset[k][1] > st[4]:
                confirmed.append((p, i, onset[k]))
                st[0] = True
            st[1] = 0
            st[3] = float(arrival[i])
        self._confirm(r, confirmed)
        ops = np.bincount(r.proc[sel], minlength=self.ctx.topo.n_procs)
        trail = {}
        for p, (going, miss, last, evidence_ns, ended_ns) in state.items():
            trail[p] = miss + int(ops[p]) - last - 1
            cul = self.ctx.culprits.get((p, LOCAL))
            if cul is not None:
                ends_here = going and trail[p] >= gap  # the misses that end it trail the walk
                cul.extra["active"] = going and not ends_here
                cul.extra["evidence_ns"] = evidence_ns
                cul.extra["ended_ns"] = evidence_ns if ends_here else ended_ns
        return trail

    def _confirm(self, r: Recs, confirmed: list[tuple[int, int, np.ndarray]]) -> None:
        """New culprits, or new episodes of known ones (a later slowdown), in order:
        (proc, the record that fired, the onset of its run)."""
        for proc, i, (seq, ns, comm, func, how, chance) in confirmed:
            if comm < 0:
                continue
            episode = {
                "onset_seq": int(seq),
                "onset_ns": float(ns),
                "comm": int(comm),
                "onset_func": FUNCS[int(func)],
                "detected_seq": int(r.seq[i]),
                "detected_ns": float(r.arrival_c[i]),
                "detected_comm": int(r.comm[i]),
                "detected_func": FUNCS[int(r.func[i])],
                "confirmed_by": _confirmed_by(how, chance, bool(self._pair[i]), self.ctx.config),
                "hits": 0,
            }
            cul = self.ctx.culprits.get((proc, LOCAL))
            if cul is None:
                cul = Culprit(
                    proc=proc,
                    cause="gpu",
                    comm=int(comm),
                    onset_seq=int(seq),
                    onset_ns=float(ns),
                    detected_seq=int(r.seq[i]),
                    detected_ns=float(r.arrival_c[i]),
                    detected_comm=int(r.comm[i]),
                )
                cul.extra["episodes"] = []
                self.ctx.culprits[(proc, LOCAL)] = cul
            cul.extra["episodes"].append(episode)
            cul.extra["active"] = True
            cul.extra["pair"] = bool(self._pair[i])
            _main_episode(cul)

    def _accumulate(self, r: Recs, z: np.ndarray) -> None:
        """A culprit's own delay and late ops, from the op that first confirmed it on,
        whether or not an episode is active: with anything less the numbers (and
        whether a finding clears its threshold) would depend on where a stream was
        cut into batches, since what precedes a confirmation lies in earlier
        batches when records arrive in small ones. Each late op counts for the
        latest episode confirmed before it."""
        culprits = {p: cul for (p, kind), cul in self.ctx.culprits.items() if kind == LOCAL}
        if not culprits:
            return
        since = np.full(self.ctx.topo.n_procs, np.inf)
        for p, cul in culprits.items():
            since[p] = cul.extra["episodes"][0]["detected_ns"]
        mine = r.arrival_c >= since[r.proc]
        if not mine.any():
            return
        self._own_delays(r, culprits, since)
        starts = {p: [e["detected_ns"] for e in c.extra["episodes"]] for p, c in culprits.items()}
        for i in np.flatnonzero(r.hit & mine).tolist():
            p = int(r.proc[i])
            cul = culprits[p]
            cul.hits += 1
            k = bisect.bisect_right(starts[p], float(r.arrival_c[i])) - 1
            cul.extra["episodes"][max(k, 0)]["hits"] += 1
            times = cul.extra.setdefault("hit_at", [])
            if len(times) < MAX_HIT_TIMES:
                times.append(
                    (
                        float(r.arrival_c[i]),
                        int(r.seq[i]),
                        int(r.comm[i]),
                        int(r.func[i]),
                        float(r.resid[i]),
                    )
                )
            cul.last_ns = max(cul.last_ns, float(r.arrival_c[i]))
            if len(cul.excess_ns) < 4096:
                cul.excess_ns.append(float(r.resid[i]))
                cul.z.append(float(z[i]))
            if len(cul.ops) < SAMPLE_OPS:
                cul.ops.append(self._op(r, i, z[i]))

    def _own_delays(self, r: Recs, culprits: dict[int, Culprit], since: np.ndarray) -> None:
        """Every rank's own delay over each culprit's time (from its confirmation on):
        the culprit's own (own_ns), and its peers' (peer_own) for report.costly to
        tell a rank later than its peers from one that merely had its share of a
        noisy job's stalls. Only the records of a significant delay (d_gap, few) are
        visited per culprit."""
        late = np.flatnonzero(r.d_gap != 0)
        n = self.ctx.topo.n_procs
        for p, cul in culprits.items():
            sel = late[r.arrival_c[late] >= since[p]]
            got = np.bincount(r.proc[sel], weights=r.d_gap[sel], minlength=n)
            cul.extra["own_ns"] = cul.extra.get("own_ns", 0.0) + float(got[p])
            held = cul.extra.get("peer_own")
            cul.extra["peer_own"] = got if held is None else held + got

    def _op(self, r: Recs, i: int, z: float) -> dict:
        return {
            "comm": self.ctx.topo.comms[int(r.comm[i])].name,
            "func": FUNCS[int(r.func[i])],
            "seq": int(r.seq[i]),
            "gap_ns": float(r.gap_g[i]),
            "peers_median_gap_ns": float(r.gap_g[i] - r.resid[i]),
            "excess_ns": float(r.resid[i]),
            "z": round(float(z), 1),
            "arrival_excess_ns": float(r.excess_h[i]),
        }

    # ------------------------------------------------------------------ report
    def findings(self) -> list[Finding]:
        out = []
        for (proc, kind), cul in sorted(self.ctx.culprits.items()):
            if kind != LOCAL:
                continue
            host, gpu = self.votes[proc]
            cul.cause = self._cause(proc)
            cul.votes = {"host": int(host), "gpu": int(gpu)}
            _main_episode(cul)
            if costly(self.ctx, cul):
                out.append(render(self.ctx, cul))
        return out


def _main_episode(cul: Culprit) -> None:
    """The finding describes the rank's longest episode (most late ops), starting at
    its densest run of late ops: late ops more than CLUSTER_GAP typical gaps apart
    (noise before the slowdown) are a separate cluster."""
    eps = cul.extra["episodes"]
    main = max(eps, key=lambda e: e["hits"])
    cul.onset_seq, cul.onset_ns, cul.comm = main["onset_seq"], main["onset_ns"], main["comm"]
    cul.detected_seq, cul.detected_ns = main["detected_seq"], main["detected_ns"]
    cul.detected_comm = main["detected_comm"]
    cul.extra["onset_func"], cul.extra["detected_func"] = main["onset_func"], main["detected_func"]
    cul.extra["confirmed_by"] = main["confirmed_by"]
    cul.extra["evidence"] = {"episodes": len(eps)} if len(eps) > 1 else {}
    hits = sorted(h for h in cul.extra.get("hit_at", []) if h[0] >= main["onset_ns"])
    k = _plateau(hits)
    if k is None or hits[k][0] <= cul.onset_ns:
        return
    first = hits[k]
    cul.onset_ns, cul.onset_seq, cul.comm = first[0], first[1], first[2]
    cul.extra["onset_func"] = FUNCS[first[3]]
    if first[0] >= cul.detected_ns:  # noise fired first; the slowdown confirms later
        det = hits[min(k + PERSIST_HINT - 1, len(hits) - 1)]
        cul.detected_ns, cul.detected_seq, cul.detected_comm = det[0], det[1], det[2]
        cul.extra["detected_func"] = FUNCS[det[3]]
        cul.extra["confirmed_by"] = {
            "rule": "steady late ops after noise",
            "slowdown_late_ops": PERSIST_HINT,
            "note": "what fired first was noise before the slowdown; detection taken at "
            "the slowdown's third late op",
        }


def _plateau(hits: list[tuple]) -> int | None:
    """Where the steady slowdown begins among an episode's late ops: the first from
    which most of the next PLATEAU late ops are at least half the typical excess and
    follow each other closely; earlier late ops were noise."""
    if len(hits) < MIN_CLUSTER:
        return None
    t = np.array([h[0] for h in hits])
    big = np.array([h[4] for h in hits]) >= 0.5 * float(np.median([h[4] for h in hits]))
    gaps = np.diff(t)
    close = np.r_[gaps <= CLUSTER_GAP * max(float(np.median(gaps)), 1.0), False]
    ok = big & close
    n = len(hits) - PLATEAU
    if n <= 0:
        return None
    window = np.convolve(ok.astype(float), np.ones(PLATEAU), "valid")[:n] / PLATEAU
    good = np.flatnonzero(big[:n] & (window >= 0.8))
    if not len(good) or good[0] < MIN_PREFIX:
        return None  # no noise before the plateau worth cutting off
    return int(good[0])
