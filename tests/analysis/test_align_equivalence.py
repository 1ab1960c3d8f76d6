"""The aggregations that replaced window functions and distinct counts in align
give exactly what the straightforward definitions give: every collective's last
and second-to-last arrival and GPU start (ties broken by rank), its lag bound,
and every communicator's process and host counts. (What align computes from them,
transfer time and bandwidth, tests/analysis/test_align.py checks.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_support import inspector_coll, inspector_p2p, write_lines

from rankwatch.align import align, collectives
from rankwatch.store import ingest

# The definitions: each collective's ranks ordered with window functions.
REFERENCE_COLLECTIVES = """
CREATE OR REPLACE TABLE ref_collectives AS
WITH r AS (
    SELECT *,
        row_number() OVER (PARTITION BY comm_key, func, seq
                           ORDER BY arrival_c DESC NULLS LAST, rank) AS arrival_desc,
        row_number() OVER (PARTITION BY comm_key, func, seq
                           ORDER BY gpu_start_c DESC NULLS LAST, rank) AS start_desc,
        row_number() OVER (PARTITION BY comm_key, func, seq
                           ORDER BY coalesce(clock_bound_ns, 1e18) DESC) AS bound_desc
    FROM ops_aligned WHERE kind = 'coll'
), agg AS (
    SELECT comm_key, func, seq,
        max(comm_id) AS comm_id, max(comm_name) AS comm_name, max(n_ranks) AS n_ranks,
        count(*) AS n_seen, count(DISTINCT host) AS hosts, max(msg_bytes) AS msg_bytes,
        min(msg_bytes) <> max(msg_bytes) AS size_mismatch,
        min(arrival_c) AS first_arrival, max(arrival_c) AS last_arrival,
        max(CASE WHEN arrival_desc = 2 THEN arrival_c END) AS second_last_arrival,
        PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY arrival_c) AS median_arrival,
        max(CASE WHEN arrival_desc = 1 THEN rank END) AS last_rank,
        max(CASE WHEN arrival_desc = 1 THEN world_rank END) AS last_world_rank,
        max(CASE WHEN arrival_desc = 1 THEN host END) AS last_host,
        min(gpu_start_c) AS first_gpu_start, max(gpu_start_c) AS last_gpu_start,
        max(CASE WHEN start_desc = 2 THEN gpu_start_c END) AS second_last_gpu_start,
        PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY gpu_start_c) AS median_gpu_start,
        max(CASE WHEN start_desc = 1 THEN world_rank END) AS last_gpu_world_rank,
        min(gpu_end_c) AS first_gpu_end, max(gpu_end_c) AS last_gpu_end,
        min(gpu_end_c) - max(gpu_start_c) AS end_minus_last_start,
        min(gpu_end_ns - gpu_start_ns) AS min_duration,
        CASE WHEN count(DISTINCT host) = 1 THEN 0.0
             WHEN count(*) FILTER (WHERE clock_bound_ns IS NULL) > 0 THEN NULL
             ELSE sum(CASE WHEN bound_desc <= 2 THEN clock_bound_ns END) END AS lag_bound_ns
    FROM r GROUP BY comm_key, func, seq
)
SELECT * FROM agg
"""

REFERENCE_COMMUNICATORS = """
CREATE OR REPLACE TABLE ref_communicators AS
WITH seen AS (
    SELECT comm_key, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
           max(n_ranks) AS n_ranks, max(nnodes) AS nnodes,
           count(DISTINCT host || ':' || CAST(pid AS VARCHAR)) AS processes,
           count(DISTINCT host) AS hosts, count(*) AS ops
    FROM ops GROUP BY comm_key
), declared AS (
    SELECT '0x' || left(ltrim(lower(substr(comm_id, 3)), '0'), 14) AS comm_key,
           max(comm_id) AS comm_id, max(comm_name) AS comm_name, max(n_ranks) AS n_ranks,
           max(nnodes) AS nnodes,
           count(DISTINCT host || ':' || CAST(pid AS VARCHAR)) AS processes,
           count(DISTINCT host) AS hosts
    FROM comms GROUP BY 1
)
SELECT coalesce(s.comm_key, d.comm_key) AS comm_key,
       coalesce(d.comm_id, s.comm_id) AS comm_id,
       coalesce(s.comm_name, d.comm_name) AS comm_name,
       greatest(coalesce(s.n_ranks, 0), coalesce(d.n_ranks, 0)) AS n_ranks,
       coalesce(s.nnodes, d.nnodes) AS nnodes,
       greatest(coalesce(s.processes, 0), coalesce(d.processes, 0)) AS processes,
       greatest(coalesce(s.hosts, 0), coalesce(d.hosts, 0)) AS hosts,
       coalesce(s.ops, 0) AS ops
FROM seen s FULL OUTER JOIN declared d ON s.comm_key = d.comm_key
"""


def _same(run, table: str, reference: str) -> None:
    """`table` (its columns the reference has: align adds the transfer time and
    bandwidth to collectives) holds exactly the reference's rows."""
    con = run.con
    ref = con.sql(f"SELECT * FROM {reference}")
    columns = ", ".join(f'"{c}"' for c in ref.columns)
    con.execute(f"CREATE OR REPLACE TEMP TABLE cmp_{table} AS SELECT {columns} FROM {table}")
    assert con.sql(f"SELECT * FROM cmp_{table}").types == ref.types
    table = f"cmp_{table}"
    for a, b in ((table, reference), (reference, table)):
        rows = con.execute(
            f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})"
        ).fetchall()[0][0]
        assert rows == 0, f"{rows} rows of {a} are not in {b}"
    assert con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] > 0


def _check(directory: Path) -> None:
    run = ingest([directory], progress=False).run()
    align(run)
    run.con.execute(REFERENCE_COLLECTIVES)
    run.con.execute(REFERENCE_COMMUNICATORS)
    _same(run, "collectives", "ref_collectives")
    _same(run, "communicators", "ref_communicators")


@pytest.mark.parametrize("job", ["clocks", "slow_gpu", "hang", "plain"])
def test_aggregations_match_their_definitions_on_simulated_jobs(sim, job: str) -> None:
    _check(sim(job))


def test_aggregations_match_their_definitions_with_ties_and_missing_times(tmp_path) -> None:
    # Given Inspector records (microsecond times, so ranks tie on arrival and GPU
    # start) of four ranks on two hosts, some without any event trace (no GPU times)
    for rank in range(4):
        lines = []
        for sn in range(30):
            rec = json.loads(inspector_coll(rank, sn, verbose=(rank + sn) % 3 != 0))
            rec["header"]["n_ranks"] = 4
            rec["metadata"]["hostname"] = f"host{rank % 2}"
            lines.append(json.dumps(rec))
        lines += [inspector_p2p(rank, sn, "Send" if rank % 2 == 0 else "Recv", rank ^ 1)
                  for sn in range(30, 34)]  # fmt: skip
        write_lines(tmp_path / f"host{rank % 2}-pid{100 + rank}.log", lines)
    run = ingest([tmp_path], progress=False).run()
    align(run)
    ties = run.con.execute(
        "SELECT count(*) FROM collectives WHERE second_last_arrival = last_arrival"
    ).fetchall()[0][0]
    assert ties > 0
    _check(tmp_path)


def test_several_passes_give_the_one_pass_table(sim, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an aligned job and its collectives computed in one pass
    run = ingest([sim("clocks")], progress=False).run()
    align(run)
    run.con.execute(collectives.COLLECTIVES_SQL)
    run.con.execute("CREATE TABLE one_pass AS SELECT * FROM collectives")
    # When they are computed again in seven passes over disjoint sequence numbers
    monkeypatch.setattr(collectives, "ROWS_PER_PASS", 1 + run.count("ops") // 7)
    run.con.execute("DROP TABLE collectives")
    collectives._collectives(run)
    # Then every collective is there once, with the same values
    assert run.count("ops") // collectives.ROWS_PER_PASS == 6
    _same(run, "collectives", "one_pass")
