"""Vectorised statistics over groups of a flat array: medians, MADs, run lengths.

Groups are given as integer ids 0..n_groups-1 per element; nothing loops in
Python per element or per group.
"""

from __future__ import annotations

import numpy as np

MAD_SCALE = 1.4826  # MAD -> standard deviation for normal data


def group_median(values: np.ndarray, gid: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the finite values of each group (NaN for a group without any)."""
    out = np.full(n_groups, np.nan)
    ok = np.isfinite(values)
    if not ok.any():
        return out
    v, g = values[ok], gid[ok]
    lo = v.min()
    span = v.max() - lo
    width = span * 1.001 + 1.0
    # one float key (group, then value; exact to 1/4 unit) sorts faster than lexsort
    exact = n_groups * width < 2.0**50
    order = np.argsort(g * width + (v - lo)) if exact else np.lexsort((v, g))
    v, g = v[order], g[order]
    counts = np.bincount(g, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = 0.5 * (v[lo] + v[hi])
    return out


def group_mad(values: np.ndarray, gid: np.ndarray, med: np.ndarray) -> np.ndarray:
    """Median absolute deviation from `med` per group (unscaled)."""
    return group_median(np.abs(values - med[gid]), gid, len(med))


def group_count(mask: np.ndarray, gid: np.ndarray, n_groups: int) -> np.ndarray:
    return np.bincount(gid[mask], minlength=n_groups)


def dense_ids(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys, id of each element), ids in key order."""
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, inv.reshape(-1)


def run_lengths(
    hit: np.ndarray, group: np.ndarray, carry: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Length of the run of consecutive hits ending at each element, per group.

    Elements must be sorted by group, then by time. `carry[g]` is the run length
    group g had before these elements. Returns (run length at each element,
    index of the element where that run started here, or -1 when it started
    before these elements)."""
    n = len(hit)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    idx = np.arange(n)
    first = np.ones(n, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    group_start = np.maximum.accumulate(np.where(first, idx, 0))
    last_break = np.maximum.accumulate(np.where(~hit, idx, -1))
    broke = last_break >= group_start
    run = np.where(broke, idx - last_break, idx - group_start + 1 + carry[group])
    run = np.where(hit, run, 0)
    started = np.where(broke, last_break + 1, np.where(carry[group] > 0, -1, group_start))
    return run, np.where(hit, started, -1)


def last_per_group(group: np.ndarray) -> np.ndarray:
    """Index of the last element of each run of equal, sorted group ids."""
    if len(group) == 0:
        return np.zeros(0, dtype=np.int64)
    last = np.ones(len(group), dtype=bool)
    last[:-1] = group[:-1] != group[1:]
    return np.flatnonzero(last)


def cusum(step: np.ndarray, group: np.ndarray, carry: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-sided CUSUM S = max(0, S_prev + step) per group, vectorised.

    Elements sorted by group, then time; `carry[g]` is S before them. Returns (S at
    each element, index where the current excursion above 0 began here, or -1
    when it began before these elements, or at no element when S is 0)."""
    n = len(step)
    if n == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    idx = np.arange(n)
    first = np.ones(n, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    gstart = np.maximum.accumulate(np.where(first, idx, 0))
    total = np.cumsum(step)
    c = total - (total - step)[gstart]  # within-group cumulative sum C_t
    gid = np.cumsum(first) - 1
    big = 4.0 * (np.abs(c).max() + np.abs(carry).max() + 1.0)
    low = np.minimum.accumulate(np.minimum(c, -carry[group]) - gid * big) + gid * big
    s = c - low
    zero = s <= 1e-9 * big
    s = np.where(zero, 0.0, s)
    last_zero = np.maximum.accumulate(np.where(zero, idx, -1))
    began = np.where(last_zero >= gstart, last_zero + 1, np.where(carry[group] > 0, -1, gstart))
    began = np.where(zero, n, began)
    return s, np.where(began >= n, -2, began)


def nanmax(a: np.ndarray) -> float:
    """Largest finite value, -inf when there is none (no warning)."""
    a = a[np.isfinite(a)]
    return float(a.max()) if len(a) else -np.inf


def nanmin(a: np.ndarray) -> float:
    a = a[np.isfinite(a)]
    return float(a.min()) if len(a) else np.inf
