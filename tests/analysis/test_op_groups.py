"""op_groups (rankwatch.align.groups) counts what the summary and who-is-who used to
count over every op: the numbers read from it must be the ones a scan of ops gives."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from analysis_support import first_op_lines, inspector_coll, inspector_p2p, write_lines

from helpers import chunk_rows_default
from rankwatch.align import align, groups
from rankwatch.align.summary import summarize
from rankwatch.store import EngineSettings, ingest, native
from rankwatch.store.engine import DEFAULT_MEMORY_LIMIT
from rankwatch.store.grouped import KEPT_GROUPS


def _mixed_job(sim, tmp_path):
    """A simulated job (DP, TP and PP communicators, P2P) plus Inspector logs of two
    more ranks on a host of their own: several formats, functions and kinds."""
    job = tmp_path / "job"
    shutil.copytree(sim("plain"), job)
    for rank in (0, 1):
        write_lines(
            job / "inspector" / f"other-host-pid{4000 + rank}.log",
            [inspector_coll(rank, sn, verbose=True) for sn in range(5)]
            + [inspector_p2p(rank, 5, "Send" if rank == 0 else "Recv", 1 - rank)],
        )
    return job


def _pairs(run, sql: str) -> dict:
    return {tuple(row[:-1]): int(row[-1]) for row in run.con.execute(sql).fetchall()}


def test_summary_counts_from_op_groups_equal_counts_over_every_op(sim, tmp_path) -> None:
    # Given a job of mixed formats, aligned and summarised
    run = ingest([_mixed_job(sim, tmp_path)], progress=False).run()
    summary = summarize(run, align(run))
    job = summary["job"]

    # Then every count read from op_groups is what a scan of ops gives
    scan = _pairs(run, "SELECT func, count(*) FROM ops GROUP BY 1")
    assert {(f,): n for f, n in summary["ops_per_func"].items()} == scan
    assert job["op_records"] == run.con.execute("SELECT count(*) FROM ops").fetchall()[0][0]
    formats = _pairs(run, "SELECT source_format, count(*) FROM ops GROUP BY 1")
    assert {(f,): n for f, n in job["formats"].items()} == formats
    assert set(formats) == {("rankwatch",), ("inspector",)}
    per_comm = _pairs(run, "SELECT comm_key, func, count(*) FROM ops GROUP BY 1, 2")
    from_summary = {
        (c["key"], f): n for c in summary["communicators"] for f, n in c["ops_per_func"].items()
    }
    assert from_summary == per_comm
    assert len({key for key, _ in per_comm}) >= 4  # DP, TP, PP and the Inspector ranks'
    first, last = run.con.execute(
        "SELECT min(arrival_ns), max(coalesce(gpu_end_ns, enqueue_end_ns, arrival_ns)) FROM ops"
    ).fetchall()[0]
    assert job["time_span_s"] == (last - first) / 1e9
    colls = run.con.execute("SELECT count(*) FROM ops WHERE kind = 'coll'").fetchall()[0][0]
    assert groups.collective_ops(run) == colls > 0
    assert sum(r["ops"] for r in summary["ranks"]) == job["op_records"]


def test_op_groups_is_recounted_when_ranks_are_mapped_again(sim, tmp_path) -> None:
    # Given an aligned run whose ops then lose a file's rows
    run = ingest([_mixed_job(sim, tmp_path)], progress=False).run()
    align(run)
    before = groups.collective_ops(run)
    run.con.execute("CREATE TABLE ops_copy AS SELECT * FROM ops WHERE source_format = 'rankwatch'")
    run.con.execute("DROP VIEW IF EXISTS ops")
    run.con.execute("DROP TABLE IF EXISTS ops")
    run.con.execute("ALTER TABLE ops_copy RENAME TO ops")
    # When aligned again, the counts follow ops
    align(run)
    after = run.con.execute("SELECT count(*) FROM ops WHERE kind = 'coll'").fetchall()[0][0]
    assert groups.collective_ops(run) == after == before - 10


@pytest.mark.parametrize("held_bytes", [None, 1, 0])
def test_op_groups_counted_while_parsing_equal_a_count_over_ops(
    sim, tmp_path, monkeypatch, held_bytes
) -> None:
    """The native reader counts its rows as it parses (store.grouped); op_groups made
    from those counts and a count of the rows other readers appended is the table a
    count over ops gives, whether its rows are held (None), spilled (1) or appended
    (0: nothing kept, op_groups counted over ops)."""
    # Given a mixed job with a file the native reader counts chunks of, then leaves
    # to DuckDB's reader (a damaged line after its first chunks)
    job = _mixed_job(sim, tmp_path)
    good = first_op_lines(sim("plain"), 30)
    write_lines(job / "late-damage-pid77.log", good[:20] + ['{"header": oops'] + good[20:])
    monkeypatch.setattr(native.Reader.__init__, "__defaults__", chunk_rows_default(7))
    settings = EngineSettings(DEFAULT_MEMORY_LIMIT, None, None, native=True)
    store = ingest([job], progress=False, settings=replace(settings, held_bytes=held_bytes))
    assert any(p.file.endswith("late-damage-pid77.log") for p in store.problems)
    run = store.run()
    assert (KEPT_GROUPS in run.meta) == (held_bytes != 0)

    # When op_groups is made (from the counts, where kept)
    groups.make(run)

    # Then it holds the rows, of the same types, that a count over ops gives
    run.con.execute(f"CREATE TABLE recount AS {groups.count_sql('ops')}")
    made = run.con.sql("SELECT * FROM op_groups")
    assert made.types == run.con.sql("SELECT * FROM recount").types
    for a, b in (("op_groups", "recount"), ("recount", "op_groups")):
        only = f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})"
        assert run.con.execute(only).fetchall()[0][0] == 0, a
    assert run.con.execute("SELECT count(*) FROM op_groups").fetchall()[0][0] >= 10
    assert KEPT_GROUPS not in run.meta  # used once: a later make() counts ops again


def test_op_groups_counted_where_key_fields_and_times_are_sometimes_missing(
    sim, tmp_path, monkeypatch
) -> None:
    """Neighbouring rows whose key fields are missing in some rows and differ in others
    (device, communicator name), and whose GPU times are sometimes missing: the counts
    and their aggregates equal a count over ops (the reader finds runs of one group
    a column at a time, and takes a column's extremes over a run at once where every
    row of the chunk has the aggregated times)."""
    records = [json.loads(line) for line in first_op_lines(sim("plain"), 120)]
    for i, record in enumerate(records[:80]):  # the rest: a chunk with every time
        op = record["rankwatch"]
        if i % 7 == 3:
            op.pop("device", None)
        else:
            op["device"] = (i // 2) % 2  # also changes between neighbours that have one
        if i % 4 == 1:
            record["header"].pop("comm_name", None)
        if i % 5 == 3:
            op["gpu_start_ns"] = None
        if i % 6 == 4:
            op["gpu_end_ns"] = None
    job = write_lines(tmp_path / "job" / "edge-pid99.log", [json.dumps(r) for r in records])
    monkeypatch.setattr(native.Reader.__init__, "__defaults__", chunk_rows_default(40))
    store = ingest([job.parent], progress=False)
    assert not store.problems
    run = store.run()
    assert KEPT_GROUPS in run.meta
    groups.make(run)
    run.con.execute(f"CREATE TABLE recount AS {groups.count_sql('ops')}")
    for a, b in (("op_groups", "recount"), ("recount", "op_groups")):
        only = f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})"
        assert run.con.execute(only).fetchall()[0][0] == 0, a
    assert run.con.execute("SELECT count(*) FROM op_groups").fetchall()[0][0] >= 8
