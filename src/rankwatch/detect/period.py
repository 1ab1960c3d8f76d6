"""Where in the training step an op is: its slot.

Training repeats the same ops every step, so a process's sequence of ops
(communicator class, function, direction, size) is periodic. The period L is
learned once from the first ops of a few processes; an op kind that occurs P
times per period then has P slots, and seq mod P says which one. Baselines
(what is normal for this rank at this point of the step) are kept per slot, so
an op that always follows heavier compute, or a rank that is always a bit late
at one op, is not mistaken for a change.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from rankwatch.detect.records import Recs

MIN_PERIODS = 3
MAX_MISMATCH = 0.05
SAMPLE_PROCS = 8
LEARN_OPS = 4096  # ops per process looked at


def find_period(symbols: np.ndarray) -> int | None:
    """Smallest L such that symbols repeat with period L (after a warm-up tenth)."""
    n = len(symbols)
    s = symbols[n // 10 :]
    n = len(s)
    for period in range(1, n // MIN_PERIODS + 1):
        if np.mean(s[period:] != s[:-period]) <= MAX_MISMATCH:
            return period
    return None


def _symbols(r: Recs, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = idx[np.lexsort((r.sym[idx], r.arrival_c[idx]))]
    with np.errstate(over="ignore"):
        full = r.sym[order] * np.int64(1_000_003) + r.msg[order]
    return full, r.sym[order]


def learn_periods(r: Recs) -> dict[int, int]:
    """Per op kind (`sym`): occurrences per step, voted over a few processes."""
    votes: dict[int, Counter] = {}
    counts = np.bincount(r.proc)
    procs = np.flatnonzero(counts)  # the processes present, ascending (as np.unique)
    procs = procs[np.argsort(-counts[procs], kind="stable")][:SAMPLE_PROCS]
    for p in procs:
        idx = np.flatnonzero(r.proc == p)[:LEARN_OPS]
        full, kind = _symbols(r, idx)
        period = find_period(full)
        if period is None:
            continue
        start = len(full) // 10
        for sym, c in Counter(kind[start : start + period].tolist()).items():
            votes.setdefault(sym, Counter())[c] += 1
    return {sym: c.most_common(1)[0][0] for sym, c in votes.items()}


def enough_to_learn(r: Recs) -> bool:
    counts = np.bincount(r.proc) if len(r) else np.zeros(0)
    return bool(len(counts) and np.sort(counts)[-min(SAMPLE_PROCS, len(counts))] >= 256)


class SlotMap:
    """Dense slot codes: slot = offset[sym] + seq mod P[sym]; grows for unseen kinds."""

    def __init__(self, periods: dict[int, int] | None = None) -> None:
        self.period: dict[int, int] = {}
        self.offset: dict[int, int] = {}
        self.size = 0
        self._lut_p = np.zeros(0, dtype=np.int64)
        self._lut_off = np.zeros(0, dtype=np.int64)
        for sym, p in sorted((periods or {}).items()):
            self._add(sym, p)

    def _add(self, sym: int, p: int) -> None:
        self.period[sym] = max(1, int(p))
        self.offset[sym] = self.size
        self.size += self.period[sym]
        if sym >= len(self._lut_p):
            grow = max(sym + 1, 2 * len(self._lut_p))
            self._lut_p = np.concatenate([self._lut_p, np.zeros(grow - len(self._lut_p), np.int64)])
            self._lut_off = np.concatenate(
                [self._lut_off, np.zeros(grow - len(self._lut_off), np.int64)]
            )
        self._lut_p[sym] = self.period[sym]
        self._lut_off[sym] = self.offset[sym]

    def codes(self, sym: np.ndarray, seq: np.ndarray) -> np.ndarray:
        if len(sym):
            top = int(sym.max())
            if top >= len(self._lut_p) or not np.all(self._lut_p[sym] > 0):
                for s in np.unique(sym).tolist():
                    if s not in self.period:
                        self._add(s, 1)
        p = self._lut_p[sym]
        return self._lut_off[sym] + np.mod(seq, p)

    def slot_of(self, code: int) -> tuple[int, int]:
        """(sym, position) of a slot code."""
        for sym, off in self.offset.items():
            if off <= code < off + self.period[sym]:
                return sym, code - off
        return -1, -1
