"""Bad or partial trace files: a clear message naming the file, the other ranks analysed."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from explain_support import rankwatch

from rankwatch.errors import RecordError
from rankwatch.explain.analysis import TraceOptions, analyze
from rankwatch.explain.kineto import read_kineto
from rankwatch.explain.load import find_trace_files, load


def _copy_job(src: Path, dst: Path) -> list[Path]:
    dst.mkdir()
    return [Path(shutil.copy(f, dst)) for f in find_trace_files([src])]


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture
def job(traces, tmp_path: Path) -> list[Path]:
    """A private copy of the healthy 4-rank job, to damage."""
    return _copy_job(traces("healthy")[0], tmp_path / "job")


def _damaged(job: list[Path], how: str) -> Path:
    victim = job[2]
    if how == "truncated json":
        _truncate(victim, 0.6)
    elif how == "truncated gzip":
        gz = victim.with_name(victim.name + ".gz")
        gz.write_bytes(gzip.compress(victim.read_bytes())[:-5000])
        victim.unlink()
        victim = gz
    elif how == "missing traceEvents":
        victim.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 2}}))
    elif how == "not json":
        victim.write_text("this is not a trace\n")
    elif how == "empty":
        victim.write_text("")
    return victim


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("truncated json", "truncated JSON"),
        ("truncated gzip", "truncated gzip"),
        ("missing traceEvents", "no traceEvents array"),
        ("not json", "malformed JSON"),
        ("empty", "the file ends early"),
    ],
)
def test_one_bad_rank_is_named_and_the_others_are_analysed(job, how: str, words: str) -> None:
    victim = _damaged(job, how)
    a = analyze([victim.parent], TraceOptions(jobs=1))
    assert [t.rank for t in a.traces] == [0, 1, 3]
    [problem] = [p for p in a.loaded.problems if p.file == str(victim)]
    assert words in problem.message
    assert "left out" in problem.message
    assert not a.ledger.check() and a.ledger.rows


def test_truncated_json_names_the_line(job) -> None:
    victim = _damaged(job, "truncated json")
    with pytest.raises(RecordError) as exc:
        read_kineto(victim)
    lines = victim.read_text().count("\n") + 1
    assert str(victim) in str(exc.value)
    assert exc.value.line == lines


def test_malformed_event_names_its_line(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json"
    f.write_text('{"traceEvents": [\n{"ph": "X", "cat": "cpu_op"},\n{"ph": "X" "cat": 1}\n]}')
    with pytest.raises(RecordError) as exc:
        read_kineto(f)
    assert exc.value.line == 3
    assert f"{f}:3: malformed JSON" in str(exc.value)


def test_bad_fields_skip_the_event_and_are_counted(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::bad", "pid": 1, "tid": 1, "ts": "x", "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "dur": 1},
        "not an object",
        {"ph": "X", "cat": "cpu_op", "name": "aten::ok", "pid": 1, "tid": 1, "ts": 5, "dur": 1},
    ]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"traceEvents": events}))
    t = read_kineto(f)
    assert sorted(t.names[i] for i in t.name) == ["aten::mm", "aten::ok"]
    messages = [p.message for p in t.problems]
    assert any("element 1: field 'ts': 'x' is not a number" in m for m in messages)
    assert any("element 2: missing field 'ts'" in m for m in messages)
    assert any("element 3" in m and "not a JSON object" in m for m in messages)


def test_nothing_usable_is_an_error_naming_the_input(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text("{}")
    with pytest.raises(RecordError, match="nothing usable to analyse: 1 file"):
        analyze([tmp_path], TraceOptions(jobs=1))


def test_sqlite_that_is_not_an_nsys_export(tmp_path: Path) -> None:
    f = tmp_path / "rank0.sqlite"
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    [problem] = load([f], jobs=1).problems
    assert "not an Nsight Systems export" in problem.message


def test_nsys_report_needs_export_first(tmp_path: Path) -> None:
    f = tmp_path / "rank0.nsys-rep"
    f.write_bytes(b"\x00" * 64)
    [problem] = load([tmp_path], jobs=1).problems
    assert "nsys export --type sqlite" in problem.message


def test_two_files_for_one_rank_keep_the_first(job) -> None:
    dup = job[1].with_name("zz_" + job[1].name)
    shutil.copy(job[1], dup)
    loaded = load([job[0].parent], jobs=1)
    assert [t.rank for t in loaded.traces] == [0, 1, 2, 3]
    assert any(p.kind == "duplicate_rank" and p.file == str(dup) for p in loaded.problems)


def test_cli_reports_the_bad_file_and_analyses_the_rest(job) -> None:
    victim = _damaged(job, "truncated gzip")
    result = rankwatch("trace", str(victim.parent), "-q", "--jobs", "2")
    assert result.returncode == 0, result.stderr
    assert f"{victim}: damaged or truncated gzip data" in result.stdout
    assert "Input: 3 rank(s) from 4 file(s)" in result.stdout
