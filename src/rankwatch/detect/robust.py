"""Vectorised statistics over groups of a flat array: medians, MADs, run lengths.

Groups are given as integer ids 0..n_groups-1 per element; nothing loops in
Python per element or per group.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rankwatch.detect import kernels

MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data


def group_sorted(
    values: np.ndarray, gid: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The finite values sorted by (group, value): (values, their group, start and
    count of each group)."""
    ok = np.isfinite(values)
    if not ok.all():
        values, gid = values[ok], gid[ok]
    v, g = values, gid
    if len(v):
        lo = v.min()
        span = v.max() - lo
        width = span * 1.001 + 1.0
        # one float key (group, then value; exact to 1/4 unit) sorts faster than lexsort
        exact = n_groups * width < 2.0**50
        order = np.argsort(g * width + (v - lo)) if exact else np.lexsort((v, g))
        v, g = v[order], g[order]
    counts = np.bincount(g, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    return v, g, starts, counts


def group_median(values: np.ndarray, gid: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the finite values of each group (NaN for a group without any)."""
    return sorted_median(*group_sorted(values, gid, n_groups))[0]


def sorted_median(
    v: np.ndarray, g: np.ndarray, starts: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per group of group_sorted's output: (median, NaN for an empty group; whether
    the group has values)."""
    out = np.full(len(counts), np.nan)
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = 0.5 * (v[lo] + v[hi])
    return out, has


def run_lengths(
    hit: np.ndarray, group: np.ndarray, carry: np.ndarray, gstart: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Length of the run of consecutive hits ending at each element, per group.

    Elements must be sorted by group, then by time. `carry[g]` is the run length
    group g had before these elements. Returns (run length at each element,
    index of the element where that run started here, or -1 when it started
    before these elements). `gstart`: group_starts(group), when the caller has it.

    Hits are rare, so the work is done at the hits: a run is a block of
    consecutive hit positions, cut where a group begins."""
    n = len(hit)
    run = np.zeros(n, dtype=np.int64)
    started = np.full(n, -1, dtype=np.int64)
    h = np.flatnonzero(hit)
    if not len(h):
        return run, started
    gs = (group_starts(group) if gstart is None else gstart)[h]
    block = np.ones(len(h), dtype=bool)
    block[1:] = h[:-1] < np.maximum(h[1:] - 1, gs[1:])  # a miss, or a new group, before
    begin = np.maximum.accumulate(np.where(block, h, 0))  # first hit of each block
    c = carry[group[h]]
    whole = begin == gs  # the run goes back to the group's first element (and maybe before)
    run[h] = np.where(whole, h - gs + 1 + c, h - begin + 1)
    started[h] = np.where(whole & (c > 0), -1, begin)
    return run, started


def run_heads(a: np.ndarray) -> np.ndarray:
    """True where a run of equal values begins (np.r_[True, a[1:] != a[:-1]], cheaper)."""
    out = np.empty(len(a), dtype=bool)
    out[:1] = True
    np.not_equal(a[1:], a[:-1], out=out[1:])
    return out


def run_tails(a: np.ndarray) -> np.ndarray:
    """True where a run of equal values ends."""
    out = np.empty(len(a), dtype=bool)
    out[-1:] = True
    np.not_equal(a[1:], a[:-1], out=out[:-1])
    return out


def group_starts(group: np.ndarray) -> np.ndarray:
    """For elements sorted by group: the index of the first element of each one's group."""
    return np.maximum.accumulate(np.where(run_heads(group), np.arange(len(group)), 0))


def trailing_misses(
    hit: np.ndarray, group: np.ndarray, carry: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per group present (sorted by group): (its last element, the number of
    consecutive non-hits that end the group, counting `carry[g]` before these
    elements when the group has no hit)."""
    last = last_per_group(group)
    begin = np.concatenate([[0], last[:-1] + 1])
    h = np.flatnonzero(hit)
    latest = np.full(len(last), -1, dtype=np.int64)
    if len(h):
        k = np.searchsorted(last, h)  # the group of each hit
        latest[k] = h  # hits ascend: the last one of a group is written last
    out = np.where(latest >= 0, last - latest, last - begin + 1 + carry[group[last]])
    return last, out


def last_per_group(group: np.ndarray) -> np.ndarray:
    """Index of the last element of each run of equal, sorted group ids."""
    return np.flatnonzero(run_tails(group))


def cusum(step: np.ndarray, group: np.ndarray, carry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-sided CUSUM S = max(0, S_prev + step) per group, vectorised.

    Elements sorted by group, then time; `carry[g]` is S before them. Returns (S at
    each element, index where the current excursion above 0 began here, or -1
    when it began before these elements, or at no element when S is 0)."""
    s, began_at = cusum_lazy(step, group, carry)
    return s, began_at(np.arange(len(step)))


def cusum_lazy(
    step: np.ndarray, group: np.ndarray, carry: np.ndarray, gstart: np.ndarray | None = None
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """cusum, with where each excursion began computed only at the elements asked
    for (callers want it at a few). `gstart`: group_starts(group) when the caller
    has it."""
    n = len(step)
    if n == 0:
        return np.zeros(0), lambda at: np.zeros(len(at), dtype=np.int64)
    if gstart is None:
        gstart = group_starts(group)
    got = kernels.cusum(step, group, carry, gstart)
    if got is None:  # no kernels: the same arrays in NumPy
        got = _cusum_arrays(step, group, carry, gstart)
    s, zero, last_zero = got

    def began_at(at: np.ndarray) -> np.ndarray:
        lz, gs = last_zero[at], gstart[at]
        began = np.where(lz >= gs, lz + 1, np.where(carry[group[at]] > 0, -1, gs))
        return np.where(zero[at], -2, began)

    return s, began_at


def _cusum_arrays(
    step: np.ndarray, group: np.ndarray, carry: np.ndarray, gstart: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cusum_lazy's (S, S at 0, latest element at 0 so far) in NumPy: S_t = C_t -
    min(min C_k, -carry) from the within-group cumulative sum C. C and its running
    minimum are summed and taken group by group in element order (segmented_accumulate),
    so S is exactly what a loop over each group's elements computes, whatever the
    other groups hold: the compiled kernels, which visit records in stream order
    group by group, give the same doubles."""
    idx = np.arange(len(step))
    heads = np.flatnonzero(gstart == idx)
    c = segmented_accumulate(step, heads, np.add)
    low = np.minimum(segmented_accumulate(c, heads, np.minimum), -carry[group])
    s = c - low  # low <= c: at 0 exactly where C is at its minimum (or at -carry)
    zero = s <= 0.0
    s[zero] = 0.0
    last_zero = np.maximum.accumulate(np.where(zero, idx, -1))
    return s, zero, last_zero


def segmented_accumulate(x: np.ndarray, heads: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """ufunc.accumulate within each segment of x (segments begin at `heads`,
    ascending, the first at 0), element by element in order as a loop would.
    Segments of like length (to the next power of two) are stacked as the rows of
    one 2-D array, padded at their ends, and accumulated along the rows: a
    handful of NumPy calls whatever the number of segments."""
    out = np.empty(len(x))
    if not len(x):
        return out
    length = np.diff(heads, append=len(x))
    width = np.left_shift(1, np.ceil(np.log2(length)).astype(np.int64))
    for w in np.unique(width).tolist():
        rows = np.flatnonzero(width == w)
        cols = np.arange(w)
        at = heads[rows, None] + cols
        inside = cols < length[rows, None]
        block = x[np.where(inside, at, 0)]
        done = ufunc.accumulate(block, axis=1)
        out[at[inside]] = done[inside]
    return out


def nanmax(a: np.ndarray) -> float:
    """Largest finite value, -inf when there is none (no warning)."""
    return float(np.max(a, initial=-np.inf, where=np.isfinite(a))) if len(a) else -np.inf


def nanmin(a: np.ndarray) -> float:
    return float(np.min(a, initial=np.inf, where=np.isfinite(a))) if len(a) else np.inf


def stable_order(key: np.ndarray, bound: int) -> np.ndarray:
    """argsort(key, kind="stable") for integer keys in [0, bound).

    NumPy sorts 16-bit integers stably with a radix sort, in linear time; a key
    below 2**32 takes two such passes (low half, then high half). That is several
    times cheaper than the merge sort a stable sort of 64-bit keys gets."""
    if bound <= 1 << 16:
        return np.argsort(key.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
        high = (key >> 16).astype(np.uint16)[order]
        return order[np.argsort(high, kind="stable")]
    return np.argsort(key, kind="stable")


def segmented_ewma(x: np.ndarray, seg: np.ndarray, init: np.ndarray, alpha: float) -> np.ndarray:
    """Exponentially weighted mean within segments, one update per element: the state
    after each element, s = s + alpha * (x - s), in element order.

    `seg` is non-decreasing (segments contiguous); `init[i]` is the state before
    element i's segment began (read at each segment's first element; NaN: the
    first element sets it). One update per element, not one per batch, keeps the
    result independent of how a stream is cut into batches.

    The recurrence s_k = a_k s_(k-1) + b_k is scanned by doubling (log steps over
    whole arrays), and stops once beta**span is below 1e-18: what lies further
    back no longer shows in double precision."""
    n = len(x)
    if not n:
        return np.zeros(0)
    beta = 1.0 - alpha
    head = run_heads(seg)
    a = np.where(head, 0.0, beta)
    b = alpha * x
    s0 = np.where(np.isfinite(init), init, x)
    b[head] += beta * s0[head]
    span = 1
    while span < n and beta**span >= 1e-18:
        b[span:] = b[span:] + a[span:] * b[:-span]
        a[span:] = a[span:] * a[:-span]
        span *= 2
    return b
