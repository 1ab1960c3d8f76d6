"""Records grouped into complete class cohorts, with bounded memory.

A class cohort (see prepare.py) is released to the detectors once it holds as
many records as its communicators have ranks, or, incomplete, once its newest
record is `evict_ns` older than the stream (a hang, a dropped record). What is
held back is only the cohorts still in progress, so memory follows the window,
not the job's length.

Released records are sorted by cohort and instance (communicator); the
`Cohorts` object gives group and instance ids and boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.detect.records import Recs
from rankwatch.detect.topology import FUNCS, SEND, Topology


@dataclass
class Cohorts:
    recs: Recs  # sorted by (key, comm)
    gid: np.ndarray  # cohort of each record
    n: int
    start: np.ndarray  # first record of each cohort
    count: np.ndarray
    partial: np.ndarray  # per cohort
    inst: np.ndarray  # instance of each record
    n_inst: int
    inst_start: np.ndarray
    inst_count: np.ndarray
    inst_gid: np.ndarray  # cohort of each instance

    def __len__(self) -> int:
        return len(self.recs)


def _ids(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For sorted keys: (id per element, start per id, count per id)."""
    n = len(sorted_keys)
    first = np.ones(n, dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    ids = np.cumsum(first) - 1
    start = np.flatnonzero(first)
    count = np.diff(np.concatenate([start, [n]]))
    return ids, start, count


def build_cohorts(
    r: Recs,
    partial_keys: np.ndarray | None = None,
    presorted: bool = False,
    ids: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    partial: np.ndarray | None = None,
) -> Cohorts:
    """Cohorts of records; `ids` (cohort id, start, count) and `partial` (per
    cohort) when the caller has them already for presorted records."""
    if not presorted:
        r = r.take(np.lexsort((r.comm, r.key)))
        ids = None
    gid, start, count = ids if ids is not None else _ids(r.key)
    inst, istart, icount = _ids(r.uid)
    if partial is None:
        partial = np.zeros(len(start), dtype=bool)
        if partial_keys is not None and len(partial_keys):
            partial = np.isin(r.key[start], partial_keys)
    return Cohorts(
        r, gid, len(start), start, count, partial, inst, len(istart), istart, icount, gid[istart]
    )


def cohort_order(key: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """Stable order by (key, comm): one sort of a combined integer when the two fit
    in 63 bits (they do unless a job has thousands of communicator classes), a
    lexsort otherwise."""
    if not len(key):
        return np.zeros(0, dtype=np.int64)
    top = int(comm.max())
    bits = max(top, 1).bit_length()
    if int(comm.min()) >= 0 and int(key.min()) >= 0 and int(key.max()) < 1 << (63 - bits):
        return np.argsort((key << bits) | comm, kind="stable")
    return np.lexsort((comm, key))


class Assembler:
    """Holds records until their class cohort is complete; see module doc."""

    def __init__(self, topo: Topology, evict_ns: float) -> None:
        self.topo = topo
        self.evict_ns = evict_ns
        self.pending = Recs()
        self.seen = np.zeros((topo.n_comms, len(FUNCS)), dtype=bool)
        if topo.issued is not None:
            for comm, f in topo.issued:
                self.seen[comm, f] = True
        self._expected()

    def _expected(self) -> None:
        t = self.topo
        exp = np.zeros((t.n_classes, len(FUNCS)), dtype=np.int64)
        sizes = t.comm_size[:, None] * self.seen
        np.add.at(exp, t.comm_class, sizes)
        exp[:, SEND] = 2 * t.class_instances
        self.expected = exp

    def _learn(self, r: Recs) -> None:
        coll = ~r.p2p
        new = ~self.seen[r.comm[coll], r.func[coll]]
        if new.any():
            self.seen[r.comm[coll][new], r.func[coll][new]] = True
            self._expected()

    def feed(self, r: Recs | None, now: float, flush: bool = False) -> Cohorts | None:
        if r is not None and len(r):
            self._learn(r)
            allr = Recs.concat([self.pending, r]) if len(self.pending) else r
        else:
            allr = self.pending
        if not len(allr):
            return None
        order = cohort_order(allr.key, allr.comm)
        keys = allr.key[order]
        gid, start, count = _ids(keys)
        head = order[start]  # the first record of each cohort
        code = np.where(allr.p2p[head], SEND, allr.func[head])
        need = self.expected[allr.cls[head], code]
        done = count >= need
        stale = ~done
        if not flush and stale.any():
            # only cohorts still incomplete need their newest record's time
            wait = np.flatnonzero(stale)
            rows = order[np.repeat(start[wait], count[wait]) + _within(count[wait])]
            end = np.where(np.isfinite(allr.gend_c[rows]), allr.gend_c[rows], allr.arrival_c[rows])
            first = np.cumsum(count[wait]) - count[wait]
            newest = np.maximum.reduceat(np.nan_to_num(end, nan=-np.inf), first)
            stale[wait] = newest < now - self.evict_ns
        out = done | stale
        release = out[gid]
        self.pending = allr.take(order[~release]) if not release.all() else Recs()
        if not out.any():
            return None
        n = count[out]
        ids = (np.repeat(np.arange(len(n)), n), np.cumsum(n) - n, n)
        take = order if release.all() else order[release]
        return build_cohorts(allr.take(take), presorted=True, ids=ids, partial=stale[out])


def _within(count: np.ndarray) -> np.ndarray:
    """0..count-1 for each group, concatenated."""
    total = int(count.sum())
    return np.arange(total) - np.repeat(np.cumsum(count) - count, count)
