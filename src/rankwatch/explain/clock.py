"""Per-rank clock offsets from the matched collectives, through rankwatch.align.clock.

The aligner estimates one offset (and drift) per clock domain against a
reference, with bounds from causality (no rank finishes a collective before the
last rank started it) and a point estimate from end-synchrony. Its input is an
`ops` table of GPU-timed collectives keyed by (communicator, function, seq); this
adapter writes the matched collectives into such a table in an in-memory DuckDB.

Clock domains: ranks whose host is known share that host's clock (the profiler
puts GPU times on the host clock); otherwise each rank is its own domain.
The offsets are reported and used only to say how far cross-rank order can be
trusted: the ledger and the divergence search use clock-free quantities
(durations), so they do not depend on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.align.clock import ClockEstimate, estimate_clocks
from rankwatch.explain.collectives import CollectiveTable
from rankwatch.explain.events import RankTrace
from rankwatch.model import Run

# Kineto and nsys put GPU times on the host clock through CUPTI's clock mapping;
# the residual is microseconds. Treated as the per-op error bound of a domain.
CLOCK_ERROR_NS = 5_000

OPS_COLUMNS = (
    "kind VARCHAR, comm_key VARCHAR, func VARCHAR, seq BIGINT, host VARCHAR, "
    "gpu_start_ns BIGINT, gpu_end_ns BIGINT, arrival_ns BIGINT, clock_error_ns BIGINT, "
    "complete BOOLEAN"
)


@dataclass
class RankClock:
    rank: int
    domain: str
    offset_ns: float  # this rank's clock minus the reference clock
    bound_ns: float | None  # |true - estimated offset| <= bound_ns; None: unknown
    drift_ppm: float
    method: str


@dataclass
class ClockResult:
    reference: str | None
    ranks: dict[int, RankClock] = field(default_factory=dict)
    consistent: bool = True
    max_bound_ns: float | None = None
    ordered_fraction: float | None = None  # collectives whose arrival order is resolvable
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "consistent": self.consistent,
            "max_bound_ns": self.max_bound_ns,
            "ordered_fraction": self.ordered_fraction,
            "ranks": [vars(c) for c in self.ranks.values()],
            "notes": self.notes,
        }


def domains(traces: list[RankTrace]) -> dict[int, str]:
    """Rank -> clock domain: the host when every rank's host is known, else the rank."""
    if all(t.host for t in traces):
        return {t.rank: str(t.host) for t in traces}
    return {t.rank: f"rank {t.rank}" for t in traces}


def _rows(table: CollectiveTable, dom: dict[int, str]) -> list[tuple[Any, ...]]:
    rows = []
    for n, coll in enumerate(table.colls):
        if len(coll.ops) < 2:
            continue
        for rank, op in coll.ops.items():
            rows.append(
                (
                    "coll",
                    str(coll.key[0]),
                    coll.meta.family,
                    n,
                    dom[rank],
                    op.start,
                    op.end,
                    op.launch,
                    CLOCK_ERROR_NS,
                    True,
                )
            )
    return rows


def _run(rows: list[tuple[Any, ...]], dom: dict[int, str]) -> Run:
    """An in-memory Run holding the ops table (inserted as Arrow: row-by-row inserts
    into DuckDB cost a millisecond each)."""
    import duckdb
    import pyarrow as pa

    names = [c.split()[0] for c in OPS_COLUMNS.split(", ")]
    types = [
        pa.string(),
        pa.string(),
        pa.string(),
        pa.int64(),
        pa.string(),
        pa.int64(),
        pa.int64(),
        pa.int64(),
        pa.int64(),
        pa.bool_(),
    ]
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    ops_arrow = pa.table(
        {n: pa.array(list(c), type=t) for n, c, t in zip(names, columns, types, strict=True)}
    )
    procs_arrow = pa.table(
        {
            "world_rank": pa.array(list(dom), type=pa.int64()),
            "host": pa.array(list(dom.values()), type=pa.string()),
        }
    )
    con = duckdb.connect()
    con.register("ops_arrow", ops_arrow)
    con.register("procs_arrow", procs_arrow)
    con.execute("CREATE TABLE ops AS SELECT * FROM ops_arrow")
    con.execute("CREATE TABLE processes AS SELECT * FROM procs_arrow")
    return Run(con, tables={"ops": "ops", "processes": "processes"})


def _ordered_fraction(table: CollectiveTable, result: ClockResult) -> float | None:
    """Share of collectives whose spread of aligned start times exceeds twice the
    offset uncertainty, i.e. whose arrival order the clocks can support."""
    if result.max_bound_ns is None:
        return None
    spreads = []
    for coll in table.colls:
        if len(coll.ops) < 2:
            continue
        starts = [op.start - result.ranks[r].offset_ns for r, op in coll.ops.items()]
        spreads.append(max(starts) - min(starts))
    if not spreads:
        return None
    return float(np.mean(np.array(spreads) > 2 * result.max_bound_ns))


def estimate(traces: list[RankTrace], table: CollectiveTable) -> ClockResult:
    """Offsets of every rank's clock (see module doc)."""
    dom = domains(traces)
    rows = _rows(table, dom)
    run = _run(rows, dom)
    try:
        est: ClockEstimate = estimate_clocks(run)
    finally:
        run.con.close()
    result = ClockResult(est.reference, consistent=est.consistent, notes=list(est.notes))
    for rank, d in dom.items():
        h = est.host(d)
        if h is None:
            result.ranks[rank] = RankClock(rank, d, 0.0, None, 0.0, "no collectives")
        else:
            result.ranks[rank] = RankClock(rank, d, h.offset_ns, h.bound_ns, h.drift_ppm, h.method)
    bounds = [c.bound_ns for c in result.ranks.values()]
    result.max_bound_ns = None if any(b is None for b in bounds) else max(bounds, default=0.0)
    result.ordered_fraction = _ordered_fraction(table, result)
    if len(set(dom.values())) == 1:
        result.notes.append("all ranks share one host clock: no offsets to estimate")
    return result
