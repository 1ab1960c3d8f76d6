"""rankwatch.store.ingest: record files in, DuckDB tables out, every bad line
reported once with its file and line while the good lines still load."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from analysis_support import (
    first_op_lines,
    inspector_coll,
    inspector_p2p,
    rccl_dump_stats,
    truth,
    write_lines,
)

from rankwatch import schema
from rankwatch.store import ingest


def count(store, table: str, where: str = "true") -> int:
    return store.con.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchall()[0][0]


def problems_of(store, path: Path) -> list:
    return [p for p in store.problems if p.file == str(path)]


def test_simulated_records_load_with_counts_matching_the_truth(sim) -> None:
    # Given a simulated 16-rank job with TP, PP and DP communicators
    directory = sim("plain")
    expected = truth(directory)["records"]
    # When it is ingested
    store = ingest([directory], progress=False)
    # Then every op and state record is in its table, and nothing was wrong
    assert count(store, "ops") == expected["ops"]
    assert count(store, "ops", "kind = 'coll'") == expected["coll"]
    assert count(store, "ops", "kind = 'p2p'") == expected["p2p"]
    for table, kind in (
        ("comms", "comm"),
        ("progress", "progress"),
        ("clock", "clock"),
        ("stats", "stats"),
    ):
        assert count(store, table) == expected["state"][kind], table
    assert store.problems == []
    assert count(store, "files") == expected["files"]
    assert count(store, "files", "reader <> 'duckdb'") == 0


def test_ops_columns_carry_the_record_fields(sim) -> None:
    # Given one op line of a simulated job
    directory = sim("plain")
    line = json.loads(first_op_lines(directory, 1)[0])
    ext = line["rankwatch"]
    # When ingested
    store = ingest([directory], progress=False)
    cursor = store.con.execute(
        "SELECT * FROM ops WHERE host = ? AND pid = ? AND comm_id = ? AND func = ? AND seq = ?",
        [
            line["metadata"]["hostname"],
            line["metadata"]["pid"],
            line["header"]["id"],
            ext["func"],
            ext["seq"],
        ],
    )
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
    # Then its flat row holds the same values
    assert len(rows) == 1
    row = rows[0]
    assert row["comm_key"] == "0x" + row["comm_id"][2:].lstrip("0")[:14]
    assert (row["rank"], row["n_ranks"], row["kind"], row["source_format"]) == (
        line["header"]["rank"],
        line["header"]["n_ranks"],
        ext["kind"],
        "rankwatch",
    )
    for column in (
        "arrival_ns",
        "gpu_start_ns",
        "gpu_end_ns",
        "api_start_ns",
        "count",
        "clock_error_ns",
        "exec_time_ns",
    ):
        assert row[column] == ext[column], column
    assert row["msg_bytes"] == ext["msg_size_bytes"]
    assert row["busbw_gbs"] == pytest.approx(line["coll_perf"]["coll_busbw_gbs"])


def test_damaged_lines_are_each_reported_once_and_the_rest_loads(sim, tmp_path) -> None:
    # Given op files with a malformed middle line, a truncated last line, wrongly
    # typed fields, and a gzip-compressed copy of good lines
    good = first_op_lines(sim("plain"), 30)
    damaged = write_lines(
        tmp_path / "run/node-a-pid1.log",
        good[:10] + ['{"header": {"id": oops'] + good[10:20] + [good[20][:80]],
        final_newline=False,
    )
    wrong = json.loads(good[0])
    wrong["rankwatch"]["api_start_ns"] = "soon"
    key_wrong = json.loads(good[1])
    key_wrong["header"]["rank"] = "three"
    typed = write_lines(
        tmp_path / "run/deeper/node-b-pid2.log",
        good[2:5] + [json.dumps(wrong), json.dumps(key_wrong)],
    )
    zipped = tmp_path / "run/deeper/node-c-pid3.log.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as stream:
        stream.write("\n".join(good) + "\n")
    # When the directory is ingested
    store = ingest([tmp_path / "run"], progress=False)
    # Then each bad line is reported once, with its file and line number
    found = {(p.file, p.line, p.kind) for p in store.problems}
    assert found == {
        (str(damaged), 11, "malformed_json"),
        (str(damaged), 22, "truncated"),
        (str(typed), 4, "wrong_type"),
        (str(typed), 5, "missing_field"),
    }
    assert len(store.problems) == 4
    message = problems_of(store, typed)[0].message
    assert "rankwatch.api_start_ns: expected int, got string" in message
    # And every good line is loaded: 20 + 4 (3 good, 1 with the bad field nulled) + 30
    assert count(store, "ops", f"source_file = '{damaged}'") == 20
    assert count(store, "ops", f"source_file = '{typed}'") == 4
    assert count(store, "ops", f"source_file = '{typed}' AND api_start_ns IS NULL") == 1
    assert count(store, "ops", f"source_file = '{zipped}'") == 30
    assert count(store, "files", "bad_lines > 0") == 2


def test_a_truncated_last_line_alone_keeps_the_fast_reader(sim, tmp_path) -> None:
    # Given an op file whose writer was killed mid-line
    good = first_op_lines(sim("plain"), 12)
    path = write_lines(
        tmp_path / "host-pid7.log", good[:11] + [good[11][:300]], final_newline=False
    )
    # When ingested
    store = ingest([tmp_path], progress=False)
    # Then the truncated line is reported once, and the other lines load
    assert [(p.line, p.kind) for p in store.problems] == [(12, "truncated")]
    assert count(store, "ops") == 11
    assert count(store, "files", f"path = '{path}' AND reader = 'duckdb'") == 1


def _gzip_cut(path: Path, lines: list[str], keep: float) -> None:
    """A gzip file of lines whose writer was killed: its first `keep` share of bytes."""
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    path.write_bytes(whole[: int(len(whole) * keep)])


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_cut_gzip_stream_keeps_its_lines_and_the_other_files(
    sim, tmp_path, monkeypatch, native
) -> None:
    # Given a job's files where one op file and one state file were gzipped by a
    # writer that was killed (their streams end early), beside intact ones
    monkeypatch.setenv("RANKWATCH_NATIVE", native)
    job = sim("plain")
    ops = first_op_lines(job, 600)
    cut_ops = tmp_path / "host-pid1.log.gz"
    _gzip_cut(cut_ops, ops, 0.6)
    whole_ops = write_lines(tmp_path / "host-pid2.log", ops[:50])
    state = sorted(job.glob("*.rwstate.jsonl"))[0].read_text().splitlines()
    cut_state = tmp_path / "host-pid1.rwstate.jsonl.gz"
    _gzip_cut(cut_state, state, 0.5)
    with gzip.open(cut_ops) as stream:  # what Python's own reader gets before failing
        readable = b""
        with pytest.raises(EOFError):
            while chunk := stream.read(1 << 12):
                readable += chunk
    # When the directory is ingested
    store = ingest([tmp_path], progress=False)
    # Then each cut file is reported once, at the line where its stream ends
    found = sorted((Path(p.file).name, p.kind) for p in store.problems)
    assert found == [(cut_ops.name, "truncated"), (cut_state.name, "truncated")]
    assert all("ends early" in p.message for p in store.problems)
    # and every whole line before the cut is loaded, as are the other files
    loaded = count(store, "ops", f"source_file = '{cut_ops}'")
    assert loaded >= readable.count(b"\n") > 0 and loaded < len(ops)
    line = next(p.line for p in store.problems if p.file == str(cut_ops))
    assert line == loaded + 1
    assert count(store, "ops", f"source_file = '{whole_ops}'") == 50
    state_rows = sum(
        count(store, t, f"source_file = '{cut_state}'")
        for t in ("comms", "progress", "clock", "stats")
    )
    assert 0 < state_rows < len(state)


def test_a_lone_surrogate_escape_loses_one_string_not_the_file(sim, tmp_path) -> None:
    # Given an op file where one line's communicator name holds a lone UTF-16
    # surrogate escape (valid JSON text, rejected by DuckDB's UTF-8 reader)
    good = first_op_lines(sim("plain"), 20)
    odd = json.loads(good[5])
    odd["header"]["comm_name"] = "tp\ud800x"
    text = json.dumps(odd)
    assert "\\ud800" in text
    path = write_lines(tmp_path / "host-pid3.log", good[:5] + [text] + good[6:])
    # When ingested
    store = ingest([tmp_path], progress=False)
    # Then that line is reported, the character replaced, and every line loaded
    assert [(p.line, p.kind) for p in store.problems] == [(6, "bad_unicode")]
    assert count(store, "ops", f"source_file = '{path}'") == 20
    names = store.con.execute(
        f"SELECT comm_name FROM ops WHERE source_file = '{path}' AND comm_name LIKE 'tp%x'"
    ).fetchall()
    assert names == [("tp\ufffdx",)]


def test_newer_schema_is_rejected_naming_both_versions(sim, tmp_path) -> None:
    # Given an op file where some lines come from a newer plugin (schema 2)
    good = first_op_lines(sim("plain"), 5)
    newer = json.loads(good[0])
    newer["rankwatch"]["schema"] = schema.SCHEMA_VERSION + 1
    path = write_lines(tmp_path / "host-pid9.log", good[:4] + [json.dumps(newer)] * 2)
    # When ingested
    store = ingest([tmp_path], progress=False)
    # Then those lines are rejected with a message naming both versions; the rest loads
    assert [p.line for p in store.problems] == [5, 6]
    for p in store.problems:
        assert p.kind == "newer_schema" and p.file == str(path)
        assert f"schema {schema.SCHEMA_VERSION + 1}" in p.message
        assert f"schema {schema.SCHEMA_VERSION}" in p.message
    assert count(store, "ops") == 4


def test_many_bad_lines_of_one_kind_are_summarised(sim, tmp_path) -> None:
    # Given a file of 50 malformed lines
    path = write_lines(tmp_path / "host-pid3.log", ['{"broken": '] * 50)
    # When ingested
    store = ingest([tmp_path], progress=False)
    # Then a few are listed and the rest counted, so every bad line is accounted for once
    assert sum(1 + p.repeats for p in store.problems) == 50
    assert len(store.problems) <= 5
    assert count(store, "files", f"path = '{path}' AND bad_lines = 50") == 1
    assert not store.usable


def test_inspector_v4_logs_load_with_their_stats(tmp_path) -> None:
    # Given NCCL Inspector v4.0 logs of two ranks (14-hex-digit ids, one verbose with
    # event_trace blocks, P2P records) and an RCCL dump_stats record
    for rank in (0, 1):
        write_lines(
            tmp_path / f"example-hostname-pid{1639453 + rank}.log",
            [
                rccl_dump_stats(rank),
                *(inspector_coll(rank, sn, verbose=rank == 1) for sn in range(3)),
                inspector_p2p(rank, 3, "Send" if rank == 0 else "Recv", 1 - rank),
                inspector_p2p(rank, 4, "Send" if rank == 0 else "Recv", 1 - rank),
            ],
        )
    # When ingested
    store = ingest([tmp_path], progress=False)
    # Then ops hold them as Inspector records, and dump_stats went to stats
    assert store.problems == []
    assert count(store, "ops", "source_format = 'inspector'") == 10
    assert count(store, "ops", "kind = 'coll' AND seq IS NOT NULL AND job_id IS NULL") == 6
    assert count(store, "stats", "source_format = 'inspector' AND coll_dropped_total = 1") == 2
    # And verbose records get host times from their event trace (us -> ns)
    assert (
        count(
            store,
            "ops",
            "rank = 1 AND kind = 'coll' AND arrival_ns IS NOT NULL "
            "AND gpu_start_ns > arrival_ns AND gpu_end_ns > gpu_start_ns",
        )
        == 3
    )
    # And P2P records get a per-pair order, so a Send meets its Recv
    seqs = store.con.execute(
        "SELECT func, list(seq ORDER BY p2p_sn) FROM ops "
        "WHERE kind = 'p2p' GROUP BY func ORDER BY func"
    ).fetchall()
    assert seqs == [("Recv", [0, 1]), ("Send", [0, 1])]


def test_state_files_fill_their_tables_and_bad_state_lines_are_reported(sim, tmp_path) -> None:
    # Given a state file with one line of an unknown kind and one missing its ts_ns
    source = sorted(sim("plain").glob("*.rwstate.jsonl"))[0]
    lines = source.read_text().splitlines()
    no_ts = json.loads(lines[-1])
    del no_ts["ts_ns"]
    path = write_lines(
        tmp_path / "h-pid1.rwstate.jsonl",
        lines + ['{"schema": 1, "kind": "mystery"}', json.dumps(no_ts)],
    )
    # When ingested
    store = ingest([tmp_path], progress=False)
    # Then both bad lines are reported with their line numbers, the others loaded
    assert sorted((p.line, p.kind) for p in store.problems) == [
        (len(lines) + 1, "unknown_kind"),
        (len(lines) + 2, "missing_field"),
    ]
    loaded = sum(count(store, t) for t in ("comms", "progress", "clock", "stats"))
    assert loaded == len(lines)
    assert count(store, "progress", f"source_file = '{path}' AND colls IS NOT NULL") > 0


def test_non_record_files_are_skipped_not_reported(sim, tmp_path) -> None:
    # Given a job directory that also holds truth.json and a README
    run = tmp_path / "job"
    shutil.copytree(sim("desync"), run)
    (run / "README.txt").write_text("notes")
    # When ingested
    store = ingest([run], progress=False)
    # Then those are skipped quietly
    assert store.problems == []
    assert [Path(s.path).name for s in store.skipped] == ["README.txt", "truth.json"]


@pytest.mark.parametrize("name", ["kept.duckdb", "kept-parquet"])
def test_store_path_keeps_the_tables_for_later_sql(sim, tmp_path, name) -> None:
    # Given a simulated job
    directory = sim("desync")
    ops = truth(directory)["records"]["ops"]
    # When ingested with a store path
    target = tmp_path / name
    ingest([directory], store_path=target, progress=False)
    # Then the tables can be read back later with plain DuckDB
    con = duckdb.connect()
    if name.endswith(".duckdb"):
        con.execute(f"ATTACH '{target}' AS kept (READ_ONLY)")
        n = con.execute("SELECT count(*) FROM kept.ops").fetchall()[0][0]
    else:
        assert (target / "schema.sql").exists()
        n = con.execute(f"SELECT count(*) FROM read_parquet('{target}/ops.parquet')").fetchall()[0][
            0
        ]
    assert n == ops


def test_a_problem_said_again_is_listed_and_counted_once() -> None:
    """A file read again another way (a bulk reader's insert failed, the careful one
    reads it) meets its damaged lines again: each is still one problem, one bad line."""
    from rankwatch.store.problems import ProblemLog

    log = ProblemLog()
    for _ in range(2):
        log.add("a.log", 7, "truncated", "truncated last line")
        log.add("a.log", 3, "syntax", "not JSON")
    log.add("a.log", 9, "syntax", "not JSON")
    assert [(p.line, p.kind) for p in log.problems()] == [(7, "truncated"), (3, "syntax"),
                                                          (9, "syntax")]  # fmt: skip
    assert log.bad_lines["a.log"] == 3
