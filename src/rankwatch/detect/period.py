"""Where in the training step an op is: its slot.

Training repeats the same ops every step, so a process's sequence of ops
(communicator class, function, direction, size) is periodic. The period L is
learned from the first ops of a few processes that use a kind (once at the
start, and again for kinds that appear later: a communicator created mid-run);
an op kind that occurs P
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


def learn_periods(r: Recs, syms: np.ndarray | None = None) -> dict[int, int]:
    """Per op kind (`sym`): occurrences per step, voted over a few processes: for
    each kind, the SAMPLE_PROCS processes with the most ops of it (so that a kind
    only a few processes use, a communicator created later, is voted on by those
    that use it, whoever else has more ops). `syms`: the kinds wanted (all)."""
    votes: dict[int, Counter] = {}
    wanted = np.unique(r.sym) if syms is None else np.asarray(syms)
    for p in _sample_procs(r, wanted):
        idx = np.flatnonzero(r.proc == p)[:LEARN_OPS]
        full, kind = _symbols(r, idx)
        period = find_period(full)
        if period is None:
            continue
        start = len(full) // 10
        for sym, c in Counter(kind[start : start + period].tolist()).items():
            votes.setdefault(sym, Counter())[c] += 1
    keep = set(wanted.tolist())
    return {sym: c.most_common(1)[0][0] for sym, c in votes.items() if sym in keep}


def _sample_procs(r: Recs, syms: np.ndarray) -> list[int]:
    """Per kind in syms, the SAMPLE_PROCS processes with the most ops of that kind
    (ties by process), as one ascending list."""
    sel = np.isin(r.sym, syms)
    if not sel.any():
        return []
    n_p = int(r.proc.max()) + 1
    key = r.sym[sel].astype(np.int64) * n_p + r.proc[sel]
    pairs, counts = np.unique(key, return_counts=True)
    sym, proc = pairs // n_p, pairs % n_p
    order = np.lexsort((proc, -counts, sym))  # per kind: most ops first
    sym, proc = sym[order], proc[order]
    rank = np.arange(len(sym)) - np.searchsorted(sym, sym, side="left")
    return sorted(set(proc[rank < SAMPLE_PROCS].tolist()))


def enough_to_learn(r: Recs, syms: np.ndarray | None = None) -> bool:
    """Enough ops to learn the kinds in syms (all): each kind's sampled processes
    (up to SAMPLE_PROCS) have at least 256 ops each."""
    if not len(r):
        return False
    wanted = np.unique(r.sym) if syms is None else np.asarray(syms)
    sel = np.isin(r.sym, wanted)
    n_p = int(r.proc.max()) + 1
    pairs = np.unique(r.sym[sel].astype(np.int64) * n_p + r.proc[sel])
    sym, proc = pairs // n_p, pairs % n_p
    if len(np.unique(sym)) < len(wanted):
        return False
    ops = np.bincount(r.proc, minlength=n_p)[proc]
    order = np.lexsort((-ops, sym))  # per kind: its processes, most ops first
    sym, ops = sym[order], ops[order]
    rank = np.arange(len(sym)) - np.searchsorted(sym, sym, side="left")
    kind = np.searchsorted(np.unique(sym), sym)  # sym is sorted: its distinct values
    n_of = np.bincount(kind)  # processes per kind
    kth = rank == np.minimum(SAMPLE_PROCS, n_of[kind]) - 1
    return bool(np.all(ops[kth] >= 256))


class LearnTally:
    """enough_to_learn over records added batch by batch, without going over the
    earlier ones again: ops per process, and which processes have ops of each kind.
    Same answer as enough_to_learn(all records so far, syms)."""

    def __init__(self, n_procs: int) -> None:
        self.ops = np.zeros(n_procs, dtype=np.int64)
        self.kind_of: dict[int, int] = {}  # sym -> row of `uses`
        self.uses = np.zeros((0, n_procs), dtype=bool)  # [kind, proc]: has ops of it

    def add(self, r: Recs) -> None:
        if not len(r):
            return
        proc = r.proc.astype(np.int64)
        top = int(proc.max()) + 1
        if top > len(self.ops):  # a process the topology did not have (live growth)
            self.ops = np.r_[self.ops, np.zeros(top - len(self.ops), np.int64)]
            self.uses = np.c_[self.uses, np.zeros((len(self.uses), top - self.uses.shape[1]), bool)]
        self.ops += np.bincount(proc, minlength=len(self.ops))
        n_p = len(self.ops)
        pairs = np.unique(r.sym.astype(np.int64) * n_p + proc)
        sym, p = pairs // n_p, pairs % n_p
        new = [x for x in np.unique(sym).tolist() if x not in self.kind_of]
        for x in new:
            self.kind_of[x] = len(self.kind_of)
        if new:
            self.uses = np.r_[self.uses, np.zeros((len(new), n_p), dtype=bool)]
        rows = np.array([self.kind_of[x] for x in sym.tolist()], dtype=np.int64)
        self.uses[rows, p] = True

    def enough(self, syms: np.ndarray) -> bool:
        """Each kind in syms has ops here, and its SAMPLE_PROCS processes with the
        most ops (all of them, if fewer) have at least 256 ops each."""
        rows = [self.kind_of.get(int(x), -1) for x in np.asarray(syms).tolist()]
        if not rows or min(rows) < 0:
            return not rows and bool(self.ops.any())
        uses = self.uses[rows]
        n = uses.sum(axis=1)
        good = (uses & (self.ops >= 256)).sum(axis=1)
        return bool(np.all(good >= np.minimum(SAMPLE_PROCS, n)))


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

    def add(self, periods: dict[int, int]) -> None:
        """Kinds learned later (a communicator created mid-run); known ones stay."""
        for sym, p in sorted(periods.items()):
            if sym not in self.period:
                self._add(sym, p)

    def unknown(self, sym: np.ndarray) -> np.ndarray:
        """Whether each kind has no slots yet."""
        inside = sym < len(self._lut_p)
        out = ~inside
        out[inside] = self._lut_p[sym[inside]] == 0
        return out

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
