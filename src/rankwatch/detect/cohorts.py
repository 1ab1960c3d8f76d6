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
    r: Recs, partial_keys: np.ndarray | None = None, presorted: bool = False
) -> Cohorts:
    if not presorted:
        r = r.take(np.lexsort((r.comm, r.key)))
    gid, start, count = _ids(r.key)
    with np.errstate(over="ignore"):
        inst_key = r.uid
    inst, istart, icount = _ids(inst_key)
    partial = np.zeros(len(start), dtype=bool)
    if partial_keys is not None and len(partial_keys):
        partial = np.isin(r.key[start], partial_keys)
    return Cohorts(
        r, gid, len(start), start, count, partial, inst, len(istart), istart, icount, gid[istart]
    )


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
        order = np.lexsort((allr.comm, allr.key))
        keys = allr.key[order]
        gid, start, count = _ids(keys)
        code = np.where(allr.p2p[order][start], SEND, allr.func[order][start])
        need = self.expected[allr.cls[order][start], code]
        end = np.where(np.isfinite(allr.gend_c), allr.gend_c, allr.arrival_c)[order]
        newest = np.maximum.reduceat(np.nan_to_num(end, nan=-np.inf), start)
        done = count >= need
        stale = ~done & (flush | (newest < now - self.evict_ns))
        release = (done | stale)[gid]
        self.pending = allr.take(order[~release])
        if not release.any():
            return None
        return build_cohorts(allr.take(order[release]), keys[start][stale], presorted=True)
