"""Compact data for the HTML report, queried from an aligned Run.

Every function reads tables that `align()` made (ops_aligned, collectives,
collective_ranks) and returns arrays sized for a browser: at most a few hundred
points per rank and figure, never one value per op record of a large job.
Nothing here draws; html_figures.py does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.align import groups
from rankwatch.align.clock import correction_sql
from rankwatch.model import Run

TIMELINE_POINTS = 600  # at most this many points per rank and row of a timeline
HEATMAP_BUCKETS = 200  # time slices of the lateness heatmap...
HEATMAP_CELLS = 250_000  # ...fewer when ranks x buckets would exceed this
PHASES = ("arrival", "gpu_start", "gpu_end")


@dataclass
class Timeline:
    """One function's collectives: each rank's delays behind its peers over time.

    delay_us[p, i, j] is the largest delay (us) of rank ranks[i] behind the earliest
    rank of the same op, over the ops of bucket j, for phase p of PHASES; NaN where
    unknown. time_s[j] is the bucket's mean job time. On the world communicator a
    bucket is ops_per_point consecutive ops; on the other communicators (world False,
    `comms` of them) it is a slice of bucket_s seconds of the job.
    """

    func: str
    world: bool
    comms: int
    ops: int
    ops_per_point: int | None
    bucket_s: float | None
    ranks: np.ndarray
    time_s: np.ndarray
    delay_us: np.ndarray


@dataclass
class LatenessGrid:
    """Mean delay (us) behind the earliest rank per rank (rows) and time slice (columns
    of per_slice collectives each, at mean job time time_s)."""

    phase: str  # gpu_start or arrival: the phase the delays are of
    ranks: np.ndarray
    time_s: np.ndarray
    per_slice: int
    delay_us: np.ndarray


def fetch(run: Run, sql: str, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Columns of a query as numpy arrays; numeric columns as float64 with NaN for NULL."""
    columns = run.con.execute(sql, params or {}).fetchnumpy()
    return {name: _plain(values) for name, values in columns.items()}


def _plain(values: Any) -> np.ndarray:
    missing = np.ma.getmaskarray(values)
    array = np.array(np.ma.getdata(values), dtype=float if values.dtype.kind in "iufb" else object)
    array[missing] = np.nan if array.dtype == float else None
    return array


def rows(run: Run, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cursor = run.con.execute(sql, params or {})
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def job_start_ns(run: Run) -> int | None:
    """Earliest arrival on the reference clock, or None when no op has a timestamp.

    Each host's earliest arrival (from op_groups: the ops counted once, not a scan of
    every op), then corrected: the correction keeps a host's order of times (its
    drift is far below one), so this is the earliest corrected arrival of
    ops_aligned without correcting every op."""
    value = run.con.execute(
        f"SELECT min({correction_sql('o.first')}) FROM (SELECT host, min(first_arrival_ns) "
        f"AS first FROM {groups.table(run)} GROUP BY host) AS o "
        "LEFT JOIN host_clock c ON c.host = o.host"
    ).fetchall()[0][0]
    return None if value is None else int(value)


@dataclass
class OpDelays:
    """Per-rank delays behind the earliest rank of each collective, aggregated for the
    timelines (`world`: the world communicator's collectives in runs of consecutive
    ops; `others`: the other communicators' in slices of `width_ns` of the job) and
    for the heatmap (`grid`: every collective two or more ranks saw, in `buckets`
    slices of equal numbers of collectives). One scan of the ops for all three."""

    world: dict[str, np.ndarray]
    others: dict[str, np.ndarray]
    grid: dict[str, np.ndarray]
    width_ns: float
    buckets: int
    collectives: int  # collectives in the heatmap


# The collectives, each with its timeline point (line_bucket: a run of consecutive ops
# of its function on the world communicator, a time slice on the others) and its
# heatmap slice (grid_bucket, for collectives two or more ranks saw); then every op
# of a world rank joined to its collective once, aggregated per timeline point and
# per heatmap cell (GROUPING SETS: `line` 0 marks the timeline rows). n_func counts
# the collectives of a function on the world communicator, or on all the others.
DELAYS_SQL = """
WITH c AS (
    SELECT comm_key, func, seq, first_arrival, first_gpu_start, first_gpu_end,
        coalesce(comm_key = $comm, false) AS world,
        CASE WHEN coalesce(comm_key = $comm, false) THEN CAST(floor(
                (row_number() OVER (PARTITION BY comm_key, func ORDER BY seq) - 1)
                * least($points, count(*) OVER (PARTITION BY comm_key, func))
                / count(*) OVER (PARTITION BY comm_key, func)) AS BIGINT)
             ELSE least(CAST(floor((first_arrival - $t0) / $width) AS BIGINT), $points - 1)
        END AS line_bucket,
        sum(CASE WHEN comm_key IS NOT NULL THEN 1 ELSE 0 END)
            OVER (PARTITION BY func, coalesce(comm_key = $comm, false)) AS n_func,
        CASE WHEN n_seen > 1 THEN ntile($buckets) OVER (
            PARTITION BY n_seen > 1 ORDER BY first_arrival, comm_key, func, seq) - 1
        END AS grid_bucket
    FROM collectives WHERE first_arrival IS NOT NULL
)
SELECT GROUPING(c.world, c.func, c.line_bucket) AS line, c.world, c.func,
       o.world_rank AS rank, c.line_bucket, c.grid_bucket,
       max(c.n_func) AS n, avg(c.first_arrival - $t0) / 1e9 AS time_s,
       max(o.arrival_c - c.first_arrival) / 1e3 AS d0,
       max(o.gpu_start_c - c.first_gpu_start) / 1e3 AS d1,
       max(o.gpu_end_c - c.first_gpu_end) / 1e3 AS d2,
       avg(o.gpu_start_c - c.first_gpu_start) / 1e3 AS gpu_start,
       avg(o.arrival_c - c.first_arrival) / 1e3 AS arrival,
       count(o.gpu_start_c) AS n_gpu, count(*) AS n_ops
FROM ops_aligned o JOIN c ON o.comm_key = c.comm_key AND o.func = c.func AND o.seq = c.seq
WHERE o.kind = 'coll' AND o.world_rank IS NOT NULL
GROUP BY GROUPING SETS ((c.world, c.func, o.world_rank, c.line_bucket),
                        (o.world_rank, c.grid_bucket))
ORDER BY ALL
"""


def op_delays(run: Run, world_key: str | None, t0: int | None) -> OpDelays | None:
    """The delays the timelines and the heatmap show (see OpDelays); None without times."""
    if t0 is None:
        return None
    end, colls, n_ranks = run.con.execute(
        "SELECT max(first_arrival), count(*) FILTER (WHERE n_seen > 1), "
        "(SELECT count(*) FROM processes) FROM collectives WHERE first_arrival IS NOT NULL"
    ).fetchall()[0]
    if end is None:
        return None
    width = max(1.0, (end - t0 + 1) / TIMELINE_POINTS)
    buckets = max(1, min(HEATMAP_BUCKETS, HEATMAP_CELLS // max(1, n_ranks), colls))
    params = {"comm": world_key, "points": TIMELINE_POINTS, "t0": t0, "width": width,
              "buckets": buckets}  # fmt: skip
    rows = fetch(run, DELAYS_SQL, params)
    line = rows["line"] == 0
    world = line & (rows["world"] == 1)
    grid = ~line & ~np.isnan(rows["grid_bucket"])

    def part(mask: np.ndarray, bucket: str) -> dict[str, np.ndarray]:
        out = {k: v[mask] for k, v in rows.items()}
        out["bucket"] = out[bucket]
        return out

    return OpDelays(
        part(world, "line_bucket"), part(line & ~world, "line_bucket"),
        part(grid, "grid_bucket"), width, buckets, int(colls),
    )  # fmt: skip


def timelines(run: Run, world_key: str | None, delays: OpDelays | None) -> list[Timeline]:
    """Per function: each rank's enqueue/GPU start/GPU end delays behind its peers, on
    the world communicator, then on all the other communicators together."""
    if world_key is None or delays is None:
        return []
    world, others = delays.world, delays.others
    out = [_timeline(world, f, 1, None) for f in dict.fromkeys(world["func"])]
    if not len(others["func"]):
        return out
    comms = dict(
        run.con.execute(
            "SELECT func, count(DISTINCT comm_key) FROM collectives WHERE comm_key <> ? "
            "AND first_arrival IS NOT NULL GROUP BY func",
            [world_key],
        ).fetchall()
    )
    width = delays.width_ns
    return out + [
        _timeline(others, f, comms[f], width / 1e9) for f in dict.fromkeys(others["func"])
    ]


def _timeline(
    data: dict[str, np.ndarray], func: str, comms: int, bucket_s: float | None
) -> Timeline:
    sel = data["func"] == func
    ranks, rank_idx = np.unique(data["rank"][sel], return_inverse=True)
    buckets = data["bucket"][sel].astype(int)
    width = int(buckets.max()) + 1
    delay = np.full((3, len(ranks), width), np.nan, dtype=np.float32)
    for p in range(3):
        delay[p, rank_idx, buckets] = data[f"d{p}"][sel]
    time_s = np.full(width, np.nan)
    sums = np.bincount(buckets, weights=data["time_s"][sel], minlength=width)
    counts = np.bincount(buckets, minlength=width)
    np.divide(sums, counts, out=time_s, where=counts > 0)
    ops = int(data["n"][sel].max())
    per_point = None if bucket_s is not None else -(-ops // width)
    return Timeline(
        func, bucket_s is None, comms, ops, per_point, bucket_s, ranks.astype(int), time_s, delay
    )


def lateness_grid(delays: OpDelays | None) -> LatenessGrid | None:
    """Rank x time-slice mean delays over every collective seen by two or more ranks.

    Slices hold equal numbers of collectives (so none is empty however bursty the job);
    GPU start delays when most ops have a GPU start, else enqueue (arrival) delays.
    """
    if delays is None or not delays.collectives:
        return None
    data, buckets = delays.grid, delays.buckets
    phase = "gpu_start" if data["n_gpu"].sum() >= 0.5 * data["n_ops"].sum() else "arrival"
    ranks, rank_idx = np.unique(data["rank"], return_inverse=True)
    slot = data["bucket"].astype(int)
    delay = np.full((len(ranks), buckets), np.nan, dtype=np.float32)
    delay[rank_idx, slot] = data[phase]
    sums = np.bincount(slot, weights=data["time_s"], minlength=buckets)
    time_s = sums / np.maximum(np.bincount(slot, minlength=buckets), 1)
    return LatenessGrid(phase, ranks.astype(int), time_s, -(-delays.collectives // buckets), delay)


BANDWIDTH_SQL = """
WITH a AS (
    SELECT comm_key, func, seq, max(algo) AS algo, max(proto) AS proto
    FROM ops WHERE kind = 'coll' GROUP BY ALL
)
SELECT c.func, CAST(floor(log2(greatest(c.msg_bytes, 1))) AS INTEGER) AS size_log2,
       coalesce(a.algo, 'unknown') AS algo, coalesce(a.proto, 'unknown') AS proto,
       c.hosts > 1 AS inter_node, count(*) AS ops,
       quantile_cont(c.busbw_gbs, 0.1) AS p10, median(c.busbw_gbs) AS p50,
       quantile_cont(c.busbw_gbs, 0.9) AS p90
FROM collectives c LEFT JOIN a ON a.comm_key = c.comm_key AND a.func = c.func AND a.seq = c.seq
WHERE c.busbw_gbs IS NOT NULL AND c.msg_bytes IS NOT NULL
GROUP BY ALL ORDER BY func, size_log2, algo, proto, inter_node
"""

RECORD_BANDWIDTH_SQL = """
SELECT func, CAST(floor(log2(greatest(msg_bytes, 1))) AS INTEGER) AS size_log2,
       coalesce(algo, 'unknown') AS algo, coalesce(proto, 'unknown') AS proto,
       coalesce(nnodes, 1) > 1 AS inter_node, count(*) AS ops,
       quantile_cont(busbw_gbs, 0.1) AS p10, median(busbw_gbs) AS p50,
       quantile_cont(busbw_gbs, 0.9) AS p90
FROM ops WHERE kind = 'coll' AND busbw_gbs IS NOT NULL AND msg_bytes IS NOT NULL
GROUP BY ALL ORDER BY func, size_log2, algo, proto, inter_node
"""


def bandwidth(run: Run) -> tuple[str, list[dict[str, Any]]]:
    """Bus bandwidth quantiles per (func, size bucket, algo, proto, intra/inter node).

    Source 'transfer': from the collectives' transfer times; 'records': the per-rank
    bandwidth the records report (execution time, which includes waiting for peers),
    used only when no transfer time is known (Inspector records without timestamps).
    """
    found = rows(run, BANDWIDTH_SQL)
    if found:
        return "transfer", found
    found = rows(run, RECORD_BANDWIDTH_SQL)
    return ("records", found) if found else ("none", [])


GAPS_SQL = """
SELECT count(*) AS ops,
       count(*) FILTER (WHERE arrival_ns IS NULL) AS untimed,
       count(*) FILTER (WHERE source_format = 'inspector') AS inspector,
       count(*) FILTER (WHERE kind = 'coll') AS colls,
       count(*) FILTER (WHERE kind = 'coll' AND gpu_start_ns IS NULL) AS no_gpu_start,
       count(*) FILTER (WHERE kind = 'coll' AND coalesce(gpu_start_stale, false)) AS stale,
       count(*) FILTER (WHERE NOT coalesce(complete, true)) AS incomplete,
       (SELECT coalesce(sum(d), 0) FROM (
            SELECT max(coalesce(dropped_pool_full, 0)) + max(coalesce(coll_dropped_total, 0))
                   + max(coalesce(p2p_dropped_total, 0)) AS d
            FROM stats GROUP BY host, pid, comm_id)) AS dropped
FROM ops
"""


def record_gaps(run: Run) -> dict[str, int]:
    """Counts of what the op records lack: timestamps, GPU times, completeness, drops."""
    return {k: int(v or 0) for k, v in rows(run, GAPS_SQL)[0].items()}
