"""Per-rank lateness, live: how far each rank's arrival (API call) and GPU start of
a collective trail the earliest rank of the same collective, as the HTML report's
heatmap defines it, accumulated per rank and per time slice as records stream in.

A collective's records arrive from its ranks at different times, so they wait in
a small pending table until every rank of the communicator has reported (or the
collective is `evict_ticks` batches old: a rank that never reports must not hold
the rest back); only collectives two or more ranks saw count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

PHASES = ("arrival", "gpu_start")
BUCKET_S = 1.0  # heatmap time slice
KEEP_BUCKETS = 120  # slices kept for the page
RECENT_BUCKETS = 10  # slices the per-rank gauge averages over
MAX_PENDING = 2_000_000  # rows; beyond this the oldest collectives are finished early
FINISH_EVERY_S = 1.0

PENDING_SQL = """
CREATE TABLE IF NOT EXISTS rw_lat_pending (comm_key VARCHAR, func VARCHAR, seq BIGINT,
    n_ranks INTEGER, world_rank BIGINT, arrival_c BIGINT, gpu_start_c BIGINT, tick BIGINT)
"""
ADD_SQL = """
INSERT INTO rw_lat_pending
SELECT comm_key, func, seq, n_ranks, world_rank, arrival_c, gpu_start_c, $tick
FROM ops_aligned
WHERE kind = 'coll' AND coalesce(complete, true) AND world_rank IS NOT NULL AND seq IS NOT NULL
"""
DONE_SQL = """
CREATE OR REPLACE TEMP TABLE rw_lat_done AS
SELECT comm_key, func, seq FROM rw_lat_pending GROUP BY ALL
HAVING count(*) >= max(n_ranks) OR max(tick) <= $oldest
"""
RESULT_SQL = """
WITH d AS (
    SELECT p.* FROM rw_lat_pending p
    JOIN rw_lat_done USING (comm_key, func, seq)
), i AS (
    SELECT comm_key, func, seq, min(arrival_c) AS a0, min(gpu_start_c) AS g0, count(*) AS n
    FROM d GROUP BY ALL
)
SELECT d.world_rank, i.a0, d.arrival_c - i.a0 AS late_arrival, d.gpu_start_c - i.g0 AS late_gpu
FROM d JOIN i USING (comm_key, func, seq) WHERE i.n > 1
"""
DELETE_SQL = """
DELETE FROM rw_lat_pending p USING rw_lat_done d
WHERE p.comm_key = d.comm_key AND p.func = d.func AND p.seq = d.seq
"""


@dataclass
class Slice:
    """One time slice: per rank and phase, summed lateness (ns) and collectives."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)


class Lateness:
    """Per-rank totals and a rolling rank x time grid; see module doc."""

    def __init__(self, evict_ticks: int = 20) -> None:
        self.evict_ticks = evict_ticks
        self.tick = 0
        self.total_ns = {p: np.zeros(0) for p in PHASES}
        self.total_n = {p: np.zeros(0, dtype=np.int64) for p in PHASES}
        self.slices: dict[int, Slice] = {}
        self.pending_rows = 0
        self._created = False
        self._finished_at = -1e9

    def add(self, con) -> None:  # noqa: ANN001 - the job's DuckDB connection
        """Fold in the collectives of the `ops_aligned` view (the current batch); finish
        the complete ones at most every FINISH_EVERY_S (four statements per finish)."""
        self.tick += 1
        if not self._created:
            con.execute(PENDING_SQL)
            self._created = True
        con.execute(ADD_SQL, {"tick": self.tick})
        now = time.monotonic()
        if now - self._finished_at < FINISH_EVERY_S:
            return
        self._finished_at = now
        self._finish(con, self.tick - self.evict_ticks)
        self.pending_rows = int(con.execute("SELECT count(*) FROM rw_lat_pending").fetchall()[0][0])
        if self.pending_rows > MAX_PENDING:  # bounded memory: finish everything pending
            self._finish(con, self.tick)

    def flush(self, con) -> None:  # noqa: ANN001
        """Finish every pending collective (the job ended)."""
        con.execute(PENDING_SQL)
        self._finish(con, self.tick + 1)

    def _finish(self, con, oldest: int) -> None:  # noqa: ANN001
        con.execute(DONE_SQL, {"oldest": oldest})
        cols = con.execute(RESULT_SQL).fetchnumpy()
        con.execute(DELETE_SQL)
        if len(cols["world_rank"]):
            self._fold(cols)

    def _fold(self, cols: dict[str, np.ndarray]) -> None:
        a0 = _floats(cols["a0"])
        keep = np.isfinite(a0)
        if not keep.any():
            return
        rank = np.asarray(cols["world_rank"], dtype=np.int64)[keep]
        self._grow(int(rank.max()) + 1)
        bucket = np.floor(a0[keep] / (BUCKET_S * 1e9)).astype(np.int64)
        cols = {k: _floats(v)[keep] for k, v in cols.items() if k.startswith("late_")}
        for phase, col in (("arrival", "late_arrival"), ("gpu_start", "late_gpu")):
            late = _floats(cols[col])
            ok = np.isfinite(late)
            np.add.at(self.total_ns[phase], rank[ok], late[ok])
            np.add.at(self.total_n[phase], rank[ok], 1)
            for b in np.unique(bucket[ok]).tolist():
                sel = ok & (bucket == b)
                s = self._slice(b)
                np.add.at(s.sums[phase], rank[sel], late[sel])
                np.add.at(s.counts[phase], rank[sel], 1)
        newest = max(self.slices)
        for b in [b for b in self.slices if b <= newest - KEEP_BUCKETS]:
            del self.slices[b]

    def _grow(self, n: int) -> None:
        if n <= len(self.total_n["arrival"]):
            return
        for p in PHASES:
            self.total_ns[p] = _pad(self.total_ns[p], n)
            self.total_n[p] = _pad(self.total_n[p], n)
            for s in self.slices.values():
                s.sums[p] = _pad(s.sums[p], n)
                s.counts[p] = _pad(s.counts[p], n)

    def _slice(self, b: int) -> Slice:
        s = self.slices.get(b)
        if s is None:
            n = len(self.total_n["arrival"])
            s = Slice(
                {p: np.zeros(n) for p in PHASES}, {p: np.zeros(n, dtype=np.int64) for p in PHASES}
            )
            self.slices[b] = s
        return s

    # ------------------------------------------------------------------ views
    @property
    def n_ranks(self) -> int:
        return len(self.total_n["arrival"])

    def phase(self) -> str:
        """gpu_start when most collectives have GPU starts, else arrival (as the report)."""
        gpu, arr = int(self.total_n["gpu_start"].sum()), int(self.total_n["arrival"].sum())
        return "gpu_start" if arr and gpu >= 0.5 * arr else "arrival"

    def recent_mean_s(self, phase: str) -> np.ndarray:
        """Per rank: mean lateness (s) over the newest RECENT_BUCKETS slices (NaN: none)."""
        n = self.n_ranks
        sums, counts = np.zeros(n), np.zeros(n, dtype=np.int64)
        if self.slices:
            newest = max(self.slices)
            for b, s in self.slices.items():
                if b > newest - RECENT_BUCKETS:
                    sums += s.sums[phase]
                    counts += s.counts[phase]
        out = np.full(n, np.nan)
        np.divide(sums, counts, out=out, where=counts > 0)
        return out / 1e9

    def grid(self, phase: str) -> dict:
        """The heatmap: slice start times (s since the epoch), ranks, mean us or None."""
        if not self.slices:
            return {"phase": phase, "bucket_s": BUCKET_S, "times": [], "ranks": [], "values": []}
        buckets = sorted(self.slices)
        sums = np.stack([self.slices[b].sums[phase] for b in buckets], axis=1)
        counts = np.stack([self.slices[b].counts[phase] for b in buckets], axis=1)
        ranks = np.flatnonzero((counts > 0).any(axis=1))
        mean_us = np.full(sums.shape, np.nan)
        np.divide(sums, counts * 1e3, out=mean_us, where=counts > 0)
        values = [[None if v != v else round(v, 3) for v in row] for row in mean_us[ranks].tolist()]
        times = [b * BUCKET_S for b in buckets]
        return {
            "phase": phase,
            "bucket_s": BUCKET_S,
            "times": times,
            "ranks": ranks.tolist(),
            "values": values,
        }


def _pad(a: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([a, np.zeros(n - len(a), dtype=a.dtype)])


def _floats(a) -> np.ndarray:  # noqa: ANN001 - numpy or masked array
    if isinstance(a, np.ma.MaskedArray):
        return a.astype(np.float64).filled(np.nan)
    return np.asarray(a, dtype=np.float64)
