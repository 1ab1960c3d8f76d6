"""The HTML report's data come from one scan of the ops (html_data.DELAYS_SQL, with
GROUPING SETS) and give what the straightforward definitions give: one query per
view (world timeline, other communicators' timeline, lateness heatmap) over
ops_aligned, and the job's start as the earliest corrected arrival of any op."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rankwatch.align import align
from rankwatch.align.summary import summarize
from rankwatch.export import html_data as data
from rankwatch.simulate import SimConfig, SlowFault, simulate
from rankwatch.store import ingest

# The definitions: each view's collectives with their buckets, joined to the ops alone.
TIMELINE_SQL = """
WITH c AS (
    SELECT comm_key, func, seq, first_arrival, first_gpu_start, first_gpu_end,
           row_number() OVER (PARTITION BY comm_key, func ORDER BY seq) - 1 AS idx,
           count(*) OVER (PARTITION BY comm_key, func) AS n,
           count(*) OVER (PARTITION BY func) AS n_func
    FROM collectives WHERE {where} AND first_arrival IS NOT NULL
), b AS (
    SELECT *, {bucket} AS bucket FROM c
)
SELECT b.func, o.world_rank AS rank, b.bucket, max(b.n_func) AS n,
       avg(b.first_arrival - $t0) / 1e9 AS time_s,
       max(o.arrival_c - b.first_arrival) / 1e3 AS d0,
       max(o.gpu_start_c - b.first_gpu_start) / 1e3 AS d1,
       max(o.gpu_end_c - b.first_gpu_end) / 1e3 AS d2
FROM ops_aligned o JOIN b ON o.comm_key = b.comm_key AND o.func = b.func AND o.seq = b.seq
WHERE o.kind = 'coll' AND o.world_rank IS NOT NULL
GROUP BY ALL ORDER BY ALL
"""
SEQ_BUCKET = "CAST(floor(idx * least($points, n) / n) AS BIGINT)"
TIME_BUCKET = "least(CAST(floor((first_arrival - $t0) / $width) AS BIGINT), $points - 1)"
GRID_SQL = """
WITH c AS (
    SELECT comm_key, func, seq, first_arrival, first_gpu_start,
           ntile($buckets) OVER (ORDER BY first_arrival, comm_key, func, seq) - 1 AS bucket
    FROM collectives WHERE first_arrival IS NOT NULL AND n_seen > 1
)
SELECT o.world_rank AS rank, c.bucket, avg(c.first_arrival - $t0) / 1e9 AS time_s,
       avg(o.gpu_start_c - c.first_gpu_start) / 1e3 AS gpu_start,
       avg(o.arrival_c - c.first_arrival) / 1e3 AS arrival,
       count(o.gpu_start_c) AS n_gpu, count(*) AS n_ops
FROM ops_aligned o JOIN c ON o.comm_key = c.comm_key AND o.func = c.func AND o.seq = c.seq
WHERE o.kind = 'coll' AND o.world_rank IS NOT NULL
GROUP BY ALL ORDER BY ALL
"""
COLUMNS = {
    "timeline": ("func", "rank", "bucket", "n", "time_s", "d0", "d1", "d2"),
    "grid": ("rank", "bucket", "time_s", "gpu_start", "arrival", "n_gpu", "n_ops"),
}


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], columns: tuple) -> None:
    assert len(want["rank"]) > 0
    for name in columns:
        a, b = got[name], want[name]
        assert a.shape == b.shape, name
        if a.dtype == object:
            assert list(a) == list(b), name
        else:  # means of the same values, summed in another order
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=name)


@pytest.mark.parametrize(
    "cfg",
    [
        SimConfig(ranks=16, hosts=4, steps=50, tp=2, pp=2, seed=3, clock_offset_us=3000,
                  drift_ppm=5, slow=SlowFault(5, 25, "gpu", 2000.0)),
        SimConfig(ranks=64, hosts=8, steps=12, tp=4, seed=7),  # 600 points: runs of ops
    ],
    ids=["tp-pp-4-hosts", "64-ranks"],
)  # fmt: skip
def test_one_scan_gives_each_views_definition(tmp_path: Path, cfg: SimConfig) -> None:
    simulate(cfg, tmp_path)
    run = ingest([tmp_path], progress=False).run()
    summary = summarize(run, align(run))
    world = summary["job"]["world_comm"]["key"]
    first = run.con.execute("SELECT min(arrival_c) FROM ops_aligned").fetchall()[0][0]
    t0 = data.job_start_ns(run)
    assert t0 == first
    delays = data.op_delays(run, world, t0)
    assert delays is not None
    params = {"comm": world, "points": data.TIMELINE_POINTS, "t0": t0}
    sql = TIMELINE_SQL.format(where="comm_key = $comm", bucket=SEQ_BUCKET)
    _same(delays.world, data.fetch(run, sql, params), COLUMNS["timeline"])
    sql = TIMELINE_SQL.format(where="comm_key <> $comm", bucket=TIME_BUCKET)
    want = data.fetch(run, sql, {**params, "width": delays.width_ns})
    _same(delays.others, want, COLUMNS["timeline"])
    want = data.fetch(run, GRID_SQL, {"t0": t0, "buckets": delays.buckets})
    _same(delays.grid, want, COLUMNS["grid"])
    shared = "SELECT count(*) FROM collectives WHERE n_seen > 1 AND first_arrival IS NOT NULL"
    assert delays.collectives == run.con.execute(shared).fetchall()[0][0]


def test_row_percentiles_are_numpys_nanpercentile_for_all_rows_at_once() -> None:
    """The delay axes' per-rank 99th percentile (html_figures.row_percentiles) gives
    np.nanpercentile's values exactly, on rows with NaN gaps, one value, ties and
    values of very different sizes."""
    from rankwatch.export.html_figures import delay_axis_top, row_percentiles

    rng = np.random.default_rng(7)
    for trial in range(200):
        rows, cols = int(rng.integers(1, 30)), int(rng.integers(1, 50))
        a = rng.standard_normal((rows, cols)) * 10.0 ** int(rng.integers(-3, 7))
        if trial % 4 == 1:
            a = np.round(a)  # ties
        if trial % 3:
            a[rng.random((rows, cols)) < rng.random()] = np.nan
        a[:, int(rng.integers(cols))] = rng.standard_normal(rows)  # a value in each row
        for q in (99.0, 50.0, 0.0, 100.0, 37.5):
            assert np.array_equal(row_percentiles(a, q), np.nanpercentile(a, q, axis=1))
    # a rare spike does not squash the axis: its top is 1.2 x the largest rank's p99
    delay = np.tile(np.linspace(0.0, 10.0, 200), (3, 1))
    delay[1, 50] = 1000.0
    delay[2, :100] = np.nan
    assert delay_axis_top(delay) == pytest.approx(1.2 * np.nanpercentile(delay[1], 99))
    assert delay_axis_top(np.full((2, 5), np.nan)) is None
