"""Ops comparable across ranks and steps.

Every GPU op (or, on CPU-only ranks, every host operator) and every data-loading
range gets a key: (name, occurrence of that name within its step). In a data- or
fully-sharded-parallel job every rank runs the same ops in the same order every
step, so the same key names "the same op" on a peer (same step) and in the rank's
own history (other steps). Durations and the idle gap before each op are kept in
dense arrays indexed [key, rank, step] (NaN where absent) so that peer and
history medians are vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.explain.events import Kind, RankTrace
from rankwatch.explain.links import Links, event_steps
from rankwatch.explain.steps import StepTable


@dataclass
class RankOps:
    rank: int
    event: np.ndarray  # event index in the trace
    step: np.ndarray  # step number (-1: outside steps)
    key: np.ndarray  # key id
    start: np.ndarray
    dur: np.ndarray
    gap: np.ndarray  # idle time of the device before the op started (ns; 0 for host ranges)
    comm: np.ndarray  # bool: communication op
    host_range: np.ndarray  # bool: data-loading range


@dataclass
class OpTable:
    ranks: list[int]  # rank at each position of axis 1
    steps: list[int]  # step number at each position of axis 2
    keys: list[tuple[str, int]]  # key id -> (name, occurrence)
    dur: np.ndarray  # float64 [key, rank, step]
    gap: np.ndarray
    per_rank: dict[int, RankOps]

    def rank_pos(self, rank: int) -> int:
        return self.ranks.index(rank)

    def step_pos(self, step: int) -> int | None:
        return self.steps.index(step) if step in self.steps else None


def _gaps(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Idle time before each op: start minus the latest end of the ops before it."""
    if len(start) == 0:
        return start.astype(np.float64)
    prev = np.maximum.accumulate(end)
    before = np.concatenate([[start[0]], prev[:-1]])
    return np.maximum(start - before, 0).astype(np.float64)


def _occurrence(step: np.ndarray, name: np.ndarray, start: np.ndarray) -> np.ndarray:
    """How many ops of the same name came earlier in the same step."""
    n = len(step)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((start, name, step))
    s, g = step[order], name[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (s[1:] != s[:-1]) | (g[1:] != g[:-1])
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    occ = np.empty(n, dtype=np.int64)
    occ[order] = np.arange(n) - first
    return occ


def _rank_ops(
    t: RankTrace, links: Links, steps: StepTable, gnames: dict[str, int]
) -> tuple[np.ndarray, ...]:
    gpu = t.has_gpu
    dev = (
        t.select(Kind.KERNEL, Kind.COMM_KERNEL, Kind.MEMCPY, Kind.MEMSET)
        if gpu
        else (t.select(Kind.CPU_OP, Kind.COMM_HOST))
    )
    host = t.select(Kind.INPUT)
    rs = steps.ranks[t.rank]
    dev_step = event_steps(t, links, rs, dev) if gpu else rs.step_at(t.start[dev])
    idx = np.concatenate([dev, host])
    step = np.concatenate([dev_step, rs.step_at(t.start[host])])
    gap = np.concatenate([_gaps(t.start[dev], t.end[dev]), np.zeros(len(host))])
    local = np.array([gnames.setdefault(n, len(gnames)) for n in t.names], dtype=np.int64)
    name = local[t.name[idx]] if len(idx) else np.zeros(0, dtype=np.int64)
    occ = _occurrence(step, name, t.start[idx])
    order = np.argsort(t.start[idx], kind="stable")
    kinds = t.kind[idx]
    comm = np.isin(kinds, [int(Kind.COMM_KERNEL), int(Kind.COMM_HOST)])
    return (
        idx[order],
        step[order],
        name[order],
        occ[order],
        gap[order],
        comm[order],
        (kinds[order] == int(Kind.INPUT)),
    )


def build(traces: list[RankTrace], links: dict[int, Links], steps: StepTable) -> OpTable:
    gnames: dict[str, int] = {}
    raw = {t.rank: _rank_ops(t, links[t.rank], steps, gnames) for t in traces}
    combos = (
        np.concatenate([r[2] * (1 << 20) + r[3] for r in raw.values()])
        if raw
        else (np.zeros(0, dtype=np.int64))
    )
    uniq, inverse = np.unique(combos, return_inverse=True)
    names = {v: k for k, v in gnames.items()}
    keys = [(names[int(c >> 20)], int(c & ((1 << 20) - 1))) for c in uniq]
    rank_list = [t.rank for t in traces]
    step_list = list(steps.numbers)
    step_arr = np.array(step_list, dtype=np.int64)
    dur = np.full((len(keys), len(rank_list), len(step_list)), np.nan)
    gap = np.full_like(dur, np.nan)
    per_rank = {}
    offset = 0
    for ri, t in enumerate(traces):
        idx, step, _, _, g, comm, hostr = raw[t.rank]
        key = inverse[offset : offset + len(idx)]
        offset += len(idx)
        d = (t.end[idx] - t.start[idx]).astype(np.float64)
        sp = np.searchsorted(step_arr, step)
        ok = (sp < len(step_arr)) & (step_arr[np.clip(sp, 0, max(len(step_arr) - 1, 0))] == step)
        ok &= len(step_arr) > 0
        dur[key[ok], ri, sp[ok]] = d[ok]
        gap[key[ok], ri, sp[ok]] = g[ok]
        per_rank[t.rank] = RankOps(t.rank, idx, step, key, t.start[idx], d, g, comm, hostr)
    return OpTable(rank_list, step_list, keys, dur, gap, per_rank)
