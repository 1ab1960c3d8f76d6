"""The analysis SQL stays portable: it transpiles to Spark and Trino (sqlglot)."""

from __future__ import annotations

import pytest

from rankwatch.align import clock, collectives, groups, p2p, ranks

sqlglot = pytest.importorskip("sqlglot")

QUERIES = {
    "op_groups": groups.count_sql("ops"),
    "op_groups_merged": groups.merge_sql(["SELECT * FROM kept", groups.count_sql("ops_appended")]),
    "communicators": ranks.COMMUNICATORS_SQL,
    "comm_members": ranks.MEMBERS_SQL,
    "processes": ranks.PROCESSES_SQL,
    "rank_map": ranks.RANK_MAP_SQL,
    "clock_obs": clock.OBS_SQL,
    "clock_pairs": clock.PAIRS_SQL.format(pair_filter=""),
    "clock_buckets": clock.BUCKET_SQL,
    "clock_detrended": clock.DETRENDED_SQL,
    "ops_aligned": collectives.OPS_ALIGNED_SQL,
    "collective_ops": collectives.COLLECTIVE_OPS_SQL,
    "collectives": collectives.COLLECTIVES_SQL,
    "collective_ranks": collectives.COLLECTIVE_RANKS_SQL,
    "rank_lateness": collectives.RANK_LATENESS_SQL,
    "p2p_ops": p2p.P2P_OPS_SQL,
    "p2p_pairs": p2p.P2P_PAIRS_SQL,
    "p2p_unmatched": p2p.UNMATCHED_SQL,
}


@pytest.mark.parametrize("dialect", ["spark", "trino"])
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_analysis_sql_transpiles(name: str, dialect: str) -> None:
    out = sqlglot.transpile(
        QUERIES[name], read="duckdb", write=dialect, unsupported_level=sqlglot.ErrorLevel.RAISE
    )
    assert out and out[0]
