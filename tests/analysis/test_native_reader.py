"""The native op-record reader (rankwatch.store.native): the same tables as
DuckDB's JSON reader on the same files, damaged ones included; a strict parser
that takes only what a JSON decoder takes; and a C library that survives
mangled input under AddressSanitizer and UBSan."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import math
import random
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_support import first_op_lines, inspector_coll, write_lines

from helpers import build_sanitized, c_compiler, chunk_rows_default, run_sanitized
from rankwatch import nativelib, schema
from rankwatch.store import EngineSettings, ingest, native
from rankwatch.store import slabs as slabs_module
from rankwatch.store.engine import DEFAULT_MEMORY_LIMIT
from rankwatch.store.tables import OP_COLUMNS, OP_GROUP_FIELDS

TABLES = ("ops", "comms", "progress", "clock", "stats", "files", "problems")

needs_library = pytest.mark.skipif(
    not native.available(), reason="the native reader library is not built"
)


# where the native reader's op rows go (store.held): all held as Arrow (the default
# budget); none (appended to the table, as in a kept store); part: a budget of 70 %
# of what the whole job takes (the batches come in either order), the rest spilled to
# Arrow IPC files; spilled: a budget too small for a batch
HELD = ("all", "none", "part", "spilled")


def _ingest(directory: Path, use_native: bool, held: str = "all"):
    budget = {"all": None, "none": 0, "spilled": 1}.get(held)
    settings = EngineSettings(DEFAULT_MEMORY_LIMIT, None, None, native=use_native)
    if held == "part":
        with file_batches():
            budget = int(0.7 * ingest([directory], progress=False, settings=settings).held.nbytes)
            settings = replace(settings, held_bytes=budget)
            return ingest([directory], progress=False, settings=settings)
    settings = replace(settings, held_bytes=budget)
    return ingest([directory], progress=False, settings=settings)


@contextlib.contextmanager
def file_batches() -> Iterator[None]:
    """Each small file's rows as a batch of their own (not read in a unit with other
    files, nor joined with theirs): a budget of part of the job then holds some
    batches and spills the rest, in whatever order the parsing threads hand them
    over."""
    saved = native.JOIN_BELOW_ROWS, native.UNIT_FILES
    native.JOIN_BELOW_ROWS, native.UNIT_FILES = 0, 1
    try:
        yield
    finally:
        native.JOIN_BELOW_ROWS, native.UNIT_FILES = saved


def spilled_rows(held) -> int:
    """Rows in the IPC files `held` spilled to."""
    return 0 if held is None else held.spilled_rows()


def spilled_sources(held) -> dict[str, int]:
    """Rows per source file in the IPC files `held` spilled to."""
    import pyarrow as pa

    counts: dict[str, int] = {}
    for path in held.files:
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        for source in table.column("source_file").to_pylist():
            counts[source] = counts.get(source, 0) + 1
    return counts


def held_rows(store) -> tuple[int, int, int]:
    """(rows held as Arrow, rows spilled to IPC files, rows in the table) of a store's ops."""
    h = store.held
    held = h.table.num_rows if h is not None and h.table is not None else 0
    spilled = spilled_rows(h)
    return held, spilled, store.count("ops") - held - spilled


def assert_same_tables(a, b) -> None:
    """Every base table holds the same rows (as multisets), problems in the same order."""
    for table in TABLES:
        left = a.con.sql(f"SELECT * FROM {table}")
        right = b.con.sql(f"SELECT * FROM {table}")
        assert left.columns == right.columns and left.types == right.types, table
        other = right.to_arrow_table()
        if table == "problems":
            continue  # compared below, in order
        a.con.register("other_side", other)
        try:
            missing, extra, n = a.con.execute(
                f"SELECT (SELECT count(*) FROM (SELECT * FROM {table} EXCEPT ALL "
                f"SELECT * FROM other_side)), (SELECT count(*) FROM (SELECT * FROM other_side "
                f"EXCEPT ALL SELECT * FROM {table})), (SELECT count(*) FROM {table})"
            ).fetchall()[0]
        finally:
            a.con.unregister("other_side")
        assert (missing, extra) == (0, 0), f"{table}: {missing} rows only one side, {extra} other"
        assert n == other.num_rows, table
    assert a.problems == b.problems
    # messages name the user's files, never a temporary copy
    assert not any("rankwatch-ingest-" in p.message for p in a.problems)


# ------------------------------------------------------------------- layout


def test_every_field_the_ops_table_reads_has_a_typed_output_column() -> None:
    layout = native.build_layout()
    outputs = {(c.group, c.name): c.code for c in layout.columns}
    assert set(outputs) == set(native.lean_projection_fields())
    declared = {(g, n): t for g, fields in OP_GROUP_FIELDS.items() for n, t in fields}
    for key, code in outputs.items():
        assert {"BIGINT": "in", "DOUBLE": "f", "VARCHAR": "s", "BOOLEAN": "b"}[declared[key]].count(
            code
        ) == 1, key
    # fields feeding INTEGER columns are range-checked to 32 bits
    assert outputs[("header", "rank")] == "n" and outputs[("rankwatch", "seq")] == "i"
    # every declared field is type-checked, used or not
    spec = layout.spec.decode()
    for group, name in declared:
        assert f"field {group} {name} " in spec


def test_the_state_layout_reads_every_state_field_with_duckdbs_types() -> None:
    """Every field the DuckDB path reads from state records has a column of the
    native state reader; its nested ones become the Arrow types DuckDB exports."""
    import duckdb

    from rankwatch.serve.convert import arrow_table
    from rankwatch.store import native_state
    from rankwatch.store.tables import state_json_columns

    columns = state_json_columns()
    shape = native_state.layout()
    assert [c.name for c in shape.columns] == list(columns)
    for c in shape.columns:
        assert f"field . {c.name} {c.code} {c.slot}" in shape.spec.decode()
        if c.code != "r":
            assert native.SQL_TO_CODE[columns[c.name]] == c.code
    nested = native_state.nested_types()
    assert sorted(nested) == ["colls", "in_flight", "p2p"]
    for name, arrow in nested.items():
        exported = arrow_table(duckdb.sql(f"SELECT NULL::{columns[name]} AS x")).schema
        assert exported.field("x").type == arrow, name
    with pytest.raises(ValueError, match="no Arrow type"):
        native_state.arrow_type("UNION(a INTEGER)")


def test_the_switch_comes_from_the_environment() -> None:
    assert EngineSettings.from_env({}).native is True
    assert EngineSettings.from_env({"RANKWATCH_NATIVE": "0"}).native is False
    assert EngineSettings(native=False).native_workers() == 0


# ------------------------------------------------------- identical tables


@needs_library
@pytest.mark.parametrize("held", HELD)
@pytest.mark.parametrize("job", ["plain", "hang", "desync"])
def test_both_readers_give_identical_tables_on_simulated_jobs(
    sim, job: str, held: str
) -> None:
    directory = sim(job)
    fast = _ingest(directory, use_native=True, held=held)
    slow = _ingest(directory, use_native=False)
    assert fast.count("ops") > 0
    assert sorted(fast.native_files) == sorted(f.path for f in fast.files)  # state files too
    assert fast.count("progress") > 0
    assert_same_tables(fast, slow)
    kept, spilled, appended = held_rows(fast)
    n = fast.count("ops")
    if held == "all":  # a small job: every row held, `ops` a view over them
        assert (kept, spilled, appended) == (n, 0, 0)
    elif held == "none":
        assert fast.held is None and appended == n
    elif held == "part":  # the budget takes a batch; the rest is spilled
        assert kept > 0 and spilled > 0 and appended == 0
        assert fast.held.nbytes <= fast.held.budget
    else:
        assert (kept, spilled, appended) == (0, n, 0)
        assert len(fast.held.files) >= 1


@needs_library
def test_small_first_chunks_and_joined_batches_give_the_same_tables(
    sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's first chunk sized from its bytes, too small here (3 rows), so the
    parser goes on with full chunks (files of 9 to 13 records, a gzip one of 60);
    files read in one chunk (1 to 3 records) joined before DuckDB, several per batch
    (tiny threshold): the same tables as the DuckDB reader's."""
    good = first_op_lines(sim("plain"), 60)
    run = tmp_path / "run"
    for i in range(5):
        write_lines(run / f"r{i}-pid{i}.log", good[i * 9 : i * 9 + 9 + i])
    for i in range(6):
        write_lines(run / f"s{i}-pid{20 + i}.log", good[50 + i : 50 + i + 1 + i % 3])
    with gzip.open(run / "z-pid9.log.gz", "wt", encoding="utf-8") as stream:
        stream.write("\n".join(good) + "\n")
    monkeypatch.setattr(native, "MIN_FIRST_ROWS", 3)
    monkeypatch.setattr(native, "SMALL_RECORD_BYTES", 1 << 40)
    monkeypatch.setattr(native.Reader.__init__, "__defaults__", chunk_rows_default(7))
    monkeypatch.setattr(native, "COALESCE_ROWS", 5)
    monkeypatch.setattr(native, "JOIN_BELOW_ROWS", 3)  # files of 3 records go as they are
    monkeypatch.setattr(native, "UNIT_FILES", 1)  # each file read alone
    joined: list[int] = []
    flush = native._Coalescer.flush

    def counted(self: native._Coalescer) -> None:
        joined.append(len(self.held))
        flush(self)

    monkeypatch.setattr(native._Coalescer, "flush", counted)
    one_thread = EngineSettings(DEFAULT_MEMORY_LIMIT, None, 1, native=True)
    fast = ingest([run], progress=False, settings=one_thread)  # one parser: files joined
    assert max(joined) >= 2, joined
    slow = _ingest(run, use_native=False)
    assert len(fast.native_files) == 12
    assert fast.count("ops") == 5 * 9 + 10 + 12 + 60
    assert_same_tables(fast, slow)


def test_units_take_small_plain_files_by_path_up_to_their_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rankwatch.store.discover import RecordFile

    monkeypatch.setattr(native, "UNIT_BYTES", 100)
    monkeypatch.setattr(native, "UNIT_FILES", 3)
    monkeypatch.setattr(native, "READ_WHOLE_BYTES", 50)

    def f(name: str, size: int, compressed: bool = False) -> RecordFile:
        return RecordFile(name, "ops", "rankwatch", compressed, size)

    files = [f("e", 10), f("big", 51), f("a", 40), f("z", 5, compressed=True), f("b", 40),
             f("c", 30), f("d", 10), f("f", 50), f("y", 3, compressed=True)]  # fmt: skip
    got = [[u.path for u in unit] for unit in native.units(files)]
    # mapped (larger) files alone, and gzip ones whose records would be, first; then
    # the rest by path, cut where the bytes (100; a gzip file's 12 times its size) or
    # the files (3) would pass the limits
    assert native.GZIP_RATIO == 12
    assert got == [["big"], ["z"], ["a", "b"], ["c", "d", "e"], ["f", "y"]]
    assert native.units([]) == []


@needs_library
def test_values_a_file_repeats_then_changes_are_read_as_duckdb_reads_them(
    sim, tmp_path: Path
) -> None:
    """The parser's templates fold a value every line so far repeated into their
    constant text, and keep a field apart once a line has another value there: values
    that change after many lines, to one of the same length, back and forth, to and
    from null, each kind of field, give the DuckDB reader's tables."""
    good = first_op_lines(sim("plain"), 120)
    edits = [
        (20, lambda r: r["rankwatch"].update(device=7)),
        (30, lambda r: r["metadata"].update(hostname="sim-node009")),  # same length
        (40, lambda r: r["rankwatch"].update(graph_captured=True)),
        (50, lambda r: r["rankwatch"].update(peer=3)),
        (60, lambda r: r["rankwatch"].update(job_id="other job \"quoted\"")),
        (70, lambda r: r.get("coll_perf", {}).update(coll_busbw_gbs=1.5)),
        (80, lambda r: r["header"].update(rank=r["header"]["rank"] + 1)),
        (90, lambda r: r["rankwatch"].update(algo=None)),
    ]
    lines = []
    for i, line in enumerate(good):
        record = json.loads(line)
        for at, edit in edits:
            if i >= at and (at != 40 or i % 2 == 0):  # graph_captured: back and forth
                edit(record)
        lines.append(json.dumps(record, separators=(",", ":")))
    run = tmp_path / "run"
    write_lines(run / "a-pid1.log", lines)
    write_lines(run / "b-pid2.log", lines[::-1])  # the same changes, the other way
    fast = _ingest(run, use_native=True)
    assert sorted(Path(p).name for p in fast.native_files) == ["a-pid1.log", "b-pid2.log"]
    assert_same_tables(fast, _ingest(run, use_native=False))
    hosts = "SELECT host, count(*) FROM ops GROUP BY host ORDER BY host"
    assert fast.con.execute(hosts).fetchall() == [("sim-node000", 60), ("sim-node009", 180)]


@needs_library
@pytest.mark.parametrize("mapped", [True, False])
def test_small_files_read_as_units_give_the_same_tables_and_rows_in_file_order(
    sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    """A job's small files read in units (one chunk, one batch, one call of each
    keeper: files mapped, read and decompressed) give the tables and the kept
    collective rows, in the same order, that reading each file alone gives."""
    directory = tmp_path / "run"
    directory.mkdir()
    for i, path in enumerate(sorted(sim("plain").iterdir())):
        if path.suffix == ".log" and i % 5 == 0:  # some gzip files among them
            with gzip.open(directory / f"{path.name}.gz", "wb") as stream:
                stream.write(path.read_bytes())
        else:
            (directory / path.name).write_bytes(path.read_bytes())
    sizes = [p.stat().st_size for p in directory.glob("*.log")]
    # the plain files mapped, or read
    monkeypatch.setattr(native, "UNIT_READ_BYTES", min(sizes) - 1 if mapped else max(sizes))
    store = _ingest(directory, use_native=True)
    ops = [f for f in store.files if f.role == "ops"]
    assert len(native.units(ops)) < len(ops)
    monkeypatch.setattr(native, "UNIT_FILES", 1)
    alone = _ingest(directory, use_native=True)
    assert_same_tables(store, alone)
    a, b = store.collectives_kept, alone.collectives_kept
    assert a.rows == b.rows > 0
    assert np.array_equal(a.seq, b.seq) and np.array_equal(a.valid, b.valid)
    for name, values in a.values.items():
        assert np.array_equal(values, b.values[name]), name
    assert _kept_members(a) == _kept_members(b)
    # several processes
    assert len(set(_kept_members(a))) > len({m[4:6] for m in _kept_members(a)}) > 1


def _kept_members(kept: Any) -> list[tuple]:
    """Each kept collective row's member, its strings as text."""

    def text(code: int | None) -> str | None:
        return kept.strings[code] if code is not None and code >= 0 else None

    decoded = [(text(cid), text(name), rank, size, text(host), pid, text(key))
               for cid, name, rank, size, host, pid, key in kept.members]  # fmt: skip
    return [decoded[m] for m in kept.member]


@needs_library
def test_a_unit_keeps_processes_apart_whose_ranks_and_communicators_are_alike(
    sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes with the same communicator, rank and size (one communicator's
    records, and the same on another host and pid) read in one unit: each row's
    member keeps its own process, as reading each file alone gives."""
    source = min(sim("plain").glob("*.log"))
    lines = source.read_text(encoding="utf-8").splitlines()
    comm = json.loads(lines[0])["header"]["id"]
    lines = [x for x in lines if json.loads(x)["header"]["id"] == comm]
    twin = []
    for line in lines:
        record = json.loads(line)
        record["metadata"].update(hostname="twin-host", pid=99)
        twin.append(json.dumps(record))
    run = tmp_path / "run"
    write_lines(run / "a-pid1.log", lines)
    write_lines(run / "b-pid99.log", twin)
    store = _ingest(run, use_native=True)
    assert len(native.units([f for f in store.files if f.role == "ops"])) == 1
    monkeypatch.setattr(native, "UNIT_FILES", 1)
    alone = _ingest(run, use_native=True)
    got = _kept_members(store.collectives_kept)
    assert got == _kept_members(alone.collectives_kept)
    assert {m[4] for m in got} == {"twin-host", json.loads(lines[0])["metadata"]["hostname"]}


@needs_library
def test_mapped_files_give_the_same_tables(sim, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files larger than READ_WHOLE_BYTES are mapped instead of read (every file
    here, with the threshold at 0), in chunks that drop parsed pages: same tables."""
    monkeypatch.setattr(native, "READ_WHOLE_BYTES", 0)
    several_chunks = chunk_rows_default(50)
    monkeypatch.setattr(native.Reader.__init__, "__defaults__", several_chunks)
    directory = sim("plain")
    fast = _ingest(directory, use_native=True)
    assert sorted(fast.native_files) == sorted(f.path for f in fast.files)
    assert_same_tables(fast, _ingest(directory, use_native=False))


def _reordered(line: str) -> str:
    """The same record with keys in reverse order, unknown keys (nested too) added,
    and strings written with escapes."""
    rec = json.loads(line)
    rec["future_object"] = {"a": [1, 2.5e3, {"b": None}], "c": 'x\\"y'}
    rec["rankwatch"]["future_field"] = [True, False, None, -0.0]
    rec["header"]["comm_name"] = 'quote " backslash \\ tab \t é 😀'
    text = json.dumps(
        {k: (dict(reversed(v.items())) if isinstance(v, dict) else v) for k, v in rec.items()},
        ensure_ascii=True,
    )
    return " " + text.replace(", ", " ,\t") + " \r"


@needs_library
@pytest.mark.parametrize("held", HELD)
def test_both_readers_give_identical_tables_on_damaged_and_unusual_files(
    sim, tmp_path: Path, held: str
) -> None:
    good = first_op_lines(sim("plain"), 40)
    run = tmp_path / "run"
    # damage the careful reader reports, one kind per file
    write_lines(
        run / "a-pid1.log",
        good[:10] + ['{"header": {"id": oops'] + good[10:20] + [good[20][:80]],
        final_newline=False,
    )
    wrong = json.loads(good[0])
    wrong["rankwatch"]["api_start_ns"] = "soon"
    key_wrong = json.loads(good[1])
    key_wrong["header"]["rank"] = "three"
    write_lines(run / "b-pid2.log", good[2:5] + [json.dumps(wrong), json.dumps(key_wrong)])
    write_lines(run / "c-pid3.log", good[:11] + [good[11][:300]], final_newline=False)
    newer = json.loads(good[0])
    newer["rankwatch"]["schema"] = schema.SCHEMA_VERSION + 1
    write_lines(run / "d-pid4.log", good[:4] + [json.dumps(newer)] * 2)
    write_lines(run / "e-pid5.log", ['{"broken": '] * 5)
    # a file of rankwatch records with an Inspector record in it
    write_lines(run / "f-pid6.log", good[:3] + [inspector_coll(0, 1)] + good[3:6])
    # unusual but valid: reordered keys, unknown keys, escapes, blank lines, no final newline
    write_lines(
        run / "g-pid7.log",
        [_reordered(x) for x in good[:8]] + ["", "   "] + good[8:12],
        final_newline=False,
    )
    # a record the DuckDB reader takes with null groups and null fields
    nulls = json.loads(good[2])
    nulls["p2p_perf"] = None
    nulls["rankwatch"]["gpu_start_ns"] = None
    nulls["rankwatch"]["algo"] = None
    write_lines(run / "h-pid8.log", [json.dumps(nulls), good[3]])
    # a duplicate key, a huge number, a lone surrogate: left to the DuckDB path
    write_lines(run / "i-pid9.log", [good[4].replace('"rank":', '"rank":1,"rank":', 1)])
    huge = json.loads(good[5])
    huge["rankwatch"]["count"] = 2**70
    write_lines(run / "j-pid10.log", [json.dumps(huge)])
    write_lines(run / "k-pid11.log", [good[6].replace('"comm_name":"', '"comm_name":"\\ud800', 1)])
    # an op record of another kind: `ops.kind` says 'other', as the DuckDB path's does
    # (the native reader leaves the file to it; its projection reads kind as it is)
    other = json.loads(good[9])
    other["rankwatch"]["kind"] = "proxy_step"
    write_lines(run / "p-pid16.log", good[12:14] + [json.dumps(other)])
    # a P2P op without seq: numbered per pair by ingest, as the DuckDB path's are
    unnumbered = json.loads(good[8])
    unnumbered["rankwatch"].update(kind="p2p", func="Send", peer=1, seq=None)
    write_lines(run / "o-pid15.log", [json.dumps(unnumbered)] + good[9:12])
    odd_id = json.loads(good[7])
    odd_id["header"]["id"] = "0xÉ0İ0ABcd"
    write_lines(run / "n-pid14.log", [json.dumps(odd_id, ensure_ascii=False)])
    with gzip.open(run / "l-pid12.log.gz", "wt", encoding="utf-8") as stream:
        stream.write("\n".join(good) + "\n")
    with gzip.open(run / "m-pid13.log.gz", "wt", encoding="utf-8") as stream:
        stream.write("\n".join(good[:5]) + "\n" + good[5][:200])
    fast = _ingest(run, use_native=True, held=held)
    slow = _ingest(run, use_native=False)
    assert_same_tables(fast, slow)
    # the native reader took the unusual but valid files and the plain file whose only
    # damage is a truncated last line; it left the rest to the DuckDB path and the
    # careful reader (which, as before, also reads a compressed file's truncated end)
    assert sorted(Path(p).name for p in fast.native_files) == [
        "c-pid3.log",
        "g-pid7.log",
        "h-pid8.log",
        "l-pid12.log.gz",
        "n-pid14.log",
    ]
    assert slow.native_files == []
    reported = {(Path(p.file).name, p.line, p.kind) for p in fast.problems}
    assert ("c-pid3.log", 12, "truncated") in reported
    assert ("m-pid13.log.gz", 6, "truncated") in reported
    assert fast.count("ops") > 60


def _state_lines(directory: Path) -> dict[str, list[str]]:
    """Lines of a simulated state file by kind, from one with in-flight ops."""
    for path in sorted(directory.glob("*.rwstate.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if any('"in_flight":[{' in x for x in lines):
            by_kind: dict[str, list[str]] = {}
            for line in lines:
                by_kind.setdefault(json.loads(line)["kind"], []).append(line)
            return by_kind
    raise AssertionError("no state file with in-flight ops")


def _edited(line: str, **fields: Any) -> str:
    record = json.loads(line)
    record.update(fields)
    return json.dumps(record)


@needs_library
def test_both_readers_give_identical_state_tables_on_damaged_and_unusual_files(
    sim, tmp_path: Path
) -> None:
    """State files: what the native reader takes it reads as DuckDB's reader does
    (nested values included); the rest it leaves to that path and the careful
    reader."""
    kinds = _state_lines(sim("hang"))
    busy = [x for x in kinds["progress"] if '"in_flight":[{' in x][:3]
    good = kinds["comm"][:1] + kinds["clock"][:3] + kinds["stats"][:3] + busy
    run = tmp_path / "run"
    write_lines(run / "a-pid1.rwstate.jsonl", good + [good[1][:90]], final_newline=False)
    write_lines(run / "b-pid2.rwstate.jsonl", good + [_edited(good[2], pid="x")])
    write_lines(run / "c-pid3.rwstate.jsonl", good + [_edited(good[2], kind="mystery")])
    write_lines(run / "d-pid4.rwstate.jsonl", good + [_edited(good[2], schema=99)])
    write_lines(run / "e-pid5.rwstate.jsonl", good[:3] + ["", "  "] + good[3:])
    write_lines(run / "f-pid6.rwstate.jsonl", good + [_edited(busy[0], comm_id=None)])
    # nested values json_transform types its own way: left to DuckDB's path
    odd = json.loads(busy[0])
    odd["colls"]["AllReduce"]["started"] = "soon"
    write_lines(run / "g-pid7.rwstate.jsonl", good + [json.dumps(odd)])
    write_lines(run / "h-pid8.rwstate.jsonl", good + [busy[1].replace(
        '"colls":{', '"colls":{"AllReduce":{"enqueued":1},', 1)])  # fmt: skip
    write_lines(run / "h-pid13.rwstate.jsonl", good + [busy[1].replace(
        '"colls":{', '"colls":{"":{"enqueued":1},"":{"enqueued":2},', 1)])  # fmt: skip
    # unusual but valid: reordered and unknown keys (nested too), escapes, nulls,
    # missing nested fields, an empty map and list, no final newline
    nested = json.loads(busy[0])
    nested["in_flight"][0].pop("seq")
    nested["in_flight"][0]["extra"] = {"deep": [1, {"x": None}]}
    nested["colls"]["All\u0052educe"] = nested["colls"].pop("AllReduce")
    nested["p2p"] = None
    nested["hostname"] = "host\twith\u00e9"
    empty = _edited(busy[1], colls={}, in_flight=[], p2p={"send_enqueued": 3})
    reordered = json.dumps(dict(reversed(list(json.loads(busy[2]).items()))))
    # a field of another kind on a stats record, beyond 32 bits: kept as it is
    wide = _edited(kinds["stats"][0], rank=3_000_000_000)
    write_lines(
        run / "h-pid9.rwstate.jsonl",
        good + [json.dumps(nested), empty, reordered, _edited(good[4], surprise=[1, 2]), wide],
        final_newline=False,
    )
    with gzip.open(run / "i-pid10.rwstate.jsonl.gz", "wt", encoding="utf-8") as stream:
        stream.write("\n".join(good) + "\n")
    with gzip.open(run / "j-pid11.rwstate.jsonl.gz", "wt", encoding="utf-8") as stream:
        stream.write("\n".join(good) + "\n" + good[0][:50])
    (run / "k-pid12.rwstate.jsonl").write_bytes(b"")
    fast = _ingest(run, use_native=True)
    slow = _ingest(run, use_native=False)
    assert_same_tables(fast, slow)
    taken = sorted(Path(p).name for p in fast.native_files if ".rwstate" in p)
    assert taken == ["h-pid9.rwstate.jsonl", "i-pid10.rwstate.jsonl.gz", "k-pid12.rwstate.jsonl"]
    reported = {(Path(p.file).name, p.line, p.kind) for p in fast.problems}
    assert ("a-pid1.rwstate.jsonl", len(good) + 1, "truncated") in reported
    assert fast.count("progress") > 10
    in_flight = fast.con.execute(
        "SELECT count(*) FROM progress, unnest(in_flight) WHERE source_file LIKE '%h-pid9%'"
    ).fetchone()
    assert in_flight is not None and in_flight[0] >= 3
    wide_rank = "SELECT count(*) FROM stats WHERE rank = 3000000000 AND source_file LIKE '%h-pid9%'"
    assert fast.con.execute(wide_rank).fetchone() == (1,)


@needs_library
def test_maps_of_thousands_of_keys_are_read_and_their_duplicates_found(
    sim, tmp_path: Path
) -> None:
    """A progress record's map of thousands of keys (checked for duplicates through a
    table past 16 keys) is read natively as DuckDB reads it; one with a key repeated
    far apart, or next to its first, is left to DuckDB's path."""
    kinds = _state_lines(sim("hang"))
    good = kinds["comm"][:1] + kinds["clock"][:2]
    record = json.loads(kinds["progress"][0])
    counts = {"enqueued": 1, "started": 1, "completed": 0}
    many = {f"Op{i}": dict(counts, enqueued=i) for i in range(5000)}
    run = tmp_path / "run"
    lines = [_edited(kinds["progress"][0], colls=dict(list(many.items())[:n])) for n in (17, 5000)]
    write_lines(run / "a-pid1.rwstate.jsonl", good + lines + lines[::-1])
    text = json.dumps(dict(record, colls=many))
    for name, repeat in (("b-pid2", "Op2500"), ("c-pid3", "Op4999"), ("d-pid4", "Op0")):
        doubled = text.replace('"colls": {', f'"colls": {{"{repeat}": {{"enqueued": 7}}, ', 1)
        write_lines(run / f"{name}.rwstate.jsonl", good + [doubled])
    fast = _ingest(run, use_native=True)
    assert_same_tables(fast, _ingest(run, use_native=False))
    taken = sorted(Path(p).name for p in fast.native_files if ".rwstate" in p)
    assert taken == ["a-pid1.rwstate.jsonl"]
    sizes = "SELECT cardinality(colls) FROM progress WHERE source_file LIKE '%a-pid1%' ORDER BY 1"
    assert [n for (n,) in fast.con.execute(sizes).fetchall()] == [17, 17, 5000, 5000]


@pytest.mark.parametrize("use_native", [True, False])
def test_a_state_file_no_table_takes_is_reported_and_the_others_load(
    sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_native: bool
) -> None:
    """Should an insert of state records fail (a value the table does not take: the
    fault is injected here, as DuckDB's error() on one file's clock records), the
    bulk readers' inserts leave nothing behind and the careful reader takes the
    files one by one: that file is reported unreadable, every other loads whole."""
    from rankwatch.store import load

    source = sim("plain")
    run = tmp_path / "run"
    run.mkdir()
    states = sorted(source.glob("*.rwstate.jsonl"))[:3]
    for path in states:
        (run / path.name).write_bytes(path.read_bytes())
    poisoned = states[1].name
    insert = load.state_insert_sql

    def failing(target: str, source: str, transform: dict[str, str] | None = None) -> str:
        sql = insert(target, source, transform)
        if target != "clock":
            return sql
        return f"{sql} AND (source_file NOT LIKE '%{poisoned}' OR error('no table takes it'))"

    monkeypatch.setattr(load, "state_insert_sql", failing)
    store = _ingest(run, use_native=use_native)
    problems = [(Path(p.file).name, p.kind) for p in store.problems]
    assert problems == [(poisoned, "unreadable")]
    assert "no table takes it" in store.problems[0].message
    monkeypatch.setattr(load, "state_insert_sql", insert)
    (run / poisoned).unlink()
    others = _ingest(run, use_native=use_native)
    for table in ("comms", "progress", "clock", "stats"):
        rows = f"SELECT source_file, count(*) FROM {table} GROUP BY ALL ORDER BY ALL"
        assert store.con.execute(rows).fetchall() == others.con.execute(rows).fetchall(), table
        assert others.count(table) > 0


@needs_library
def test_a_file_with_more_strings_than_16_bit_codes_hold_goes_through_duckdb(
    sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held batches keep strings as 16-bit codes (native.arrow_schema): a file whose
    dictionary outgrows them is left to DuckDB's reader, with the same tables."""
    directory = sim("plain")
    monkeypatch.setattr(native, "MAX_CODES", 3)  # every op file has more
    fast = _ingest(directory, use_native=True)
    assert not any(p.endswith(".log") for p in fast.native_files)
    assert_same_tables(fast, _ingest(directory, use_native=False))
    assert fast.count("ops") > 0


@needs_library
def test_small_files_whose_strings_together_outgrow_16_bit_codes_are_joined_apart(
    sim, tmp_path: Path
) -> None:
    """Small files' batches are joined (their dictionaries unified) before DuckDB:
    three files of 2,000 records with 14,000 distinct strings each, 42,000 together,
    more than the 16-bit codes hold; joined apart, with the DuckDB reader's tables
    (joined whole, pyarrow refused the union and the ingest failed)."""
    template = json.loads(first_op_lines(sim("plain"), 1)[0])
    run = tmp_path / "run"
    for f in range(3):
        lines = []
        for i in range(2000):
            record = json.loads(json.dumps(template))
            tag = f"{f}-{i}"
            record["header"]["comm_name"] = f"name-{tag}"
            ext = record["rankwatch"]
            for field in ("job_id", "datatype", "algo", "proto"):
                ext[field] = f"{field}-{tag}"
            record["metadata"]["hostname"] = f"host-{tag}"
            record["header"]["id"] = f"0x{f:04x}{i:012x}"
            lines.append(json.dumps(record))
        write_lines(run / f"big{f}-pid{f}.log", lines)
    one_thread = EngineSettings(DEFAULT_MEMORY_LIMIT, None, 1, native=True)
    fast = ingest([run], progress=False, settings=one_thread)  # one parser: files joined
    assert len(fast.native_files) == 3
    assert fast.count("ops") == 6000
    assert_same_tables(fast, _ingest(run, use_native=False))


@needs_library
def test_a_nested_type_spec_with_anything_after_the_type_is_refused() -> None:
    for spec in (b"i", b"L s ", b"S 1 a i"):
        lib, handle = native.new_handle("rwn_new", spec, "nested reader")
        lib.rwn_free(handle)
    for spec in (b"i extra", b"i x", b"S 1 a i zz", b"L"):
        with pytest.raises(RuntimeError, match="nested reader: bad nested type spec"):
            native.new_handle("rwn_new", spec, "nested reader")


@needs_library
def test_a_file_without_the_library_goes_through_duckdb(
    sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = sim("desync")
    with_library = _ingest(directory, use_native=True)
    monkeypatch.setitem(nativelib._loaded, native.LIB_FILENAME, None)  # as if never built
    assert not native.available()
    assert EngineSettings().native_workers() == 0
    without = _ingest(directory, use_native=True)
    assert_same_tables(with_library, without)


def test_comm_keys_are_computed_as_the_sql_computes_them() -> None:
    import duckdb

    ids = ["0x00ABcdef0123456789", "0x7f8c496ae9f661", "0xÉ0İ0ABcd", "0x", "", "0x0000", "x"]
    expr = next(e for n, _, e, _ in OP_COLUMNS if n == "comm_key").replace("header.id", "x")
    con = duckdb.connect()
    want = [con.execute(f"SELECT {expr} FROM (SELECT ?::VARCHAR AS x)", [i]).fetchall()[0][0]
            for i in ids]  # fmt: skip
    assert native.comm_keys(ids) == want
    assert want[0] == "0xabcdef01234567"


# ---------------------------------------------------------- strict parsing


def _mutations(lines: list[str], count: int, rng: random.Random) -> list[bytes]:
    pieces = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"0", b"-", b".", b"e", b"1e999",
              b"null", b"true", b" ", b"\x00", b"\x1f", b"\xc3", b"\xff", b"\\u00e9", b"\\ud83d",
              b"99999999999999999999", b"\xe2\x82\xac"]  # fmt: skip
    out = []
    for _ in range(count):
        line = bytearray(rng.choice(lines).encode())
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(line) + 1)
            op = rng.randrange(4)
            if op == 0 and line:
                del line[at : at + rng.randint(1, 8)]
            elif op == 1:
                line[at:at] = rng.choice(pieces)
            elif op == 2 and at < len(line):
                line[at] = rng.randrange(256)
            else:
                line = line[:at]
        out.append(bytes(line).replace(b"\n", b" "))
    return out


def _parse_one(
    reader: native.Reader, text: bytes, reset: bool = True
) -> tuple[bool, dict[tuple[str, str], Any]]:
    """(accepted, values) of one line through the library. Without reset, the line
    continues the same file: the parser may use the layouts of earlier lines."""
    lib = reader._lib
    if reset:
        lib.rwp_reset(reader._p)
    flagged = lib.rwp_flagged(reader._p)
    chunk = reader.bind_chunk(reader.chunk_rows)
    buf = np.frombuffer(text + b"\n", dtype=np.uint8)
    lib.rwp_parse(reader._p, buf.ctypes.data, len(buf), 1)
    chunk, strings = reader._finish_chunk(chunk)
    if chunk.rows == 0:
        assert lib.rwp_flagged(reader._p) - flagged == (1 if text.strip() else 0)
        return False, {}
    keys = native.comm_keys(strings)
    batch = native.to_arrow(reader.layout, chunk, strings, "x", keys).to_pylist()[0]
    values = {}
    for c in reader.layout.columns:
        value = batch[native.flat_name(c.group, c.name)]
        assert batch[c.group] or value is None  # a field of a missing object is NULL
        values[(c.group, c.name)] = value
    return True, values


def _expected(obj: dict, group: str, name: str) -> Any:
    value = obj.get(group, {}) if isinstance(obj.get(group), dict) else None
    return None if value is None else value.get(name)


@needs_library
@pytest.mark.parametrize("same_file", [False, True], ids=["line_by_line", "one_file"])
def test_the_parser_accepts_only_what_a_json_decoder_accepts_with_the_same_values(
    sim, same_file: bool
) -> None:
    # one_file: the lines follow each other in one file, so most are read through
    # the layout of an earlier line, which a mutated line must not fool
    lines = first_op_lines(sim("plain"), 60)
    p2p = [x for x in first_op_lines(sim("plain"), 400) if "p2p_perf" in x][:10]
    rng = random.Random(20261129)
    accepted = rejected = 0
    texts = [line.encode() for line in lines + p2p] + _mutations(lines + p2p, 3000, rng)
    if same_file:
        texts = [t for two in zip(texts, rng.sample(texts, len(texts)), strict=True) for t in two]
    with native.Reader(native.layout(), chunk_rows=4) as reader:
        for i, text in enumerate(texts):
            # files of 200 lines: long enough to reuse layouts, short enough that the
            # string dictionary (rebuilt here after every line) stays small
            ok, values = _parse_one(reader, text, reset=not same_file or i % 200 == 0)
            try:
                obj = json.loads(text)
            except ValueError:
                assert not ok, text
                rejected += 1
                continue
            if not ok:
                rejected += 1
                continue
            accepted += 1
            assert isinstance(obj, dict)
            for (group, name), got in values.items():
                want = _expected(obj, group, name)
                if isinstance(want, float) or isinstance(got, float):
                    assert float(got) == float(want), (group, name, text)
                else:
                    assert got == want and type(got) is type(want), (group, name, text)
    assert accepted > 200 and rejected > 1000


def _unkept_integer_field() -> tuple[str, str]:
    """An integer field the layout checks but keeps no column of."""
    for line in native.layout().spec.decode().splitlines():
        kind, *rest = line.split()
        if kind == "field" and rest[2] == "i" and rest[3] == "-1":
            return rest[0], rest[1]
    raise AssertionError("every integer field has a column")


NUMBER_TEXTS = ["19.534740", "0.5", "0.000028", "7.25", "0.0", "1234567.12345678",
                "12345678.5", "9.123456789", "2.8e-05", "1.5E3", "-1.5", "0", "40", "01.5",
                "00.1", "1.", ".5", "1.5.5", "1e400", "1767225615188119524",
                "9223372036854775807", "9223372036854775808", "99999999999999999999", "00",
                "-12", "1.0", "1e3", "-9223372036854775808", "-9223372036854775809",
                "12a", "1767225615188119524.5"]  # fmt: skip


@needs_library
def test_numbers_a_template_reads_are_accepted_and_valued_as_json_says(sim) -> None:
    """Numbers in a template's place (a field that varies from line to line) are
    read by shortcuts: a decimal of a few digits, an integer whose value is not
    kept. Each text is accepted exactly when a JSON decoder reads it as the field's
    type (a float, or an integer that fits 64 bits), with the decoder's value."""
    base = json.loads(first_op_lines(sim("plain"), 1)[0])
    unkept = _unkept_integer_field()
    bw = ("coll_perf", "coll_algobw_gbs")

    def line(float_text: str, int_text: str) -> bytes:
        record = json.loads(json.dumps(base))
        record[bw[0]][bw[1]] = "@F@"
        record[unkept[0]][unkept[1]] = "@I@"
        text = json.dumps(record, separators=(",", ":"))
        return text.replace('"@F@"', float_text).replace('"@I@"', int_text).encode()

    with native.Reader(native.layout(), chunk_rows=4) as reader:
        for float_text in NUMBER_TEXTS:
            for int_text in ["1767225615188119524", *NUMBER_TEXTS]:
                reader._lib.rwp_reset(reader._p)
                for warm in range(3):  # both fields vary: the template keeps them apart
                    assert _parse_one(reader, line(f"{warm}.25", str(10**18 + warm)), False)[0]
                ok, values = _parse_one(reader, line(float_text, int_text), reset=False)
                try:
                    want_f = json.loads(float_text)
                    want_i = json.loads(int_text)
                except ValueError:
                    assert not ok, (float_text, int_text)
                    continue
                valid = (isinstance(want_f, (int, float)) and math.isfinite(want_f)
                         and isinstance(want_i, int) and -(2**63) <= want_i < 2**63)  # fmt: skip
                assert ok == valid, (float_text, int_text)
                if ok:
                    assert values[bw] == float(want_f), (float_text, values[bw])


@needs_library
def test_values_a_template_folds_replace_what_the_buffers_held(sim) -> None:
    """A template writes the values it folded over each run of rows it matched; in
    buffers that held other values (a chunk's memory bound again) every row gets
    the line's value, true or false, a number or a string."""
    base = json.loads(first_op_lines(sim("plain"), 1)[0])

    def lines(captured: bool, device: int, job: str) -> bytes:
        out = []
        for i in range(40):
            record = json.loads(json.dumps(base))
            record["rankwatch"].update(graph_captured=captured, device=device, job_id=job,
                                       seq=i)  # fmt: skip
            out.append(json.dumps(record, separators=(",", ":")))
        return ("\n".join(out) + "\n").encode()

    layout = native.layout()
    slot = {c.name: c.slot for c in layout.columns if c.group == "rankwatch"}
    with native.Reader(layout, chunk_rows=64) as reader:
        chunk = reader.bind_chunk(64)
        bound = chunk.pointers()
        for captured, device, job in [(True, 3, "first"), (False, 5, "second"), (True, 1, "x")]:
            reader._lib.rwp_reset(reader._p)
            assert reader._lib.rwp_bind(reader._p, 64, *bound) == 0
            text = np.frombuffer(lines(captured, device, job), dtype=np.uint8)
            reader._lib.rwp_parse(reader._p, text.ctypes.data, len(text), 1)
            assert reader._lib.rwp_rows(reader._p) == 40
            bits = native.unpack(chunk.values[slot["graph_captured"]], 40)
            assert bits.tolist() == [captured] * 40
            assert chunk.values[slot["device"]][:40].tolist() == [device] * 40
            codes = set(chunk.values[slot["job_id"]][:40].tolist())
            assert [reader.string(code) for code in codes] == [job]
            assert chunk.values[slot["seq"]][:40].tolist() == list(range(40))


@needs_library
def test_keys_in_any_order_and_unknown_keys_are_read(sim) -> None:
    line = first_op_lines(sim("plain"), 1)[0]
    with native.Reader(native.layout()) as reader:
        ok, values = _parse_one(reader, _reordered(line).encode())
    assert ok
    obj = json.loads(line)
    assert values[("header", "comm_name")] == 'quote " backslash \\ tab \t é 😀'
    assert values[("rankwatch", "arrival_ns")] == obj["rankwatch"]["arrival_ns"]
    assert values[("metadata", "hostname")] == obj["metadata"]["hostname"]


@needs_library
def test_null_strings_have_a_valid_code_and_their_batches_combine(sim) -> None:
    """A NULL string's code is 0, not whatever the buffer held: Arrow reads those
    codes too when it combines or unifies dictionaries, and crashed on garbage."""
    import pyarrow as pa

    lines = []
    for i, line in enumerate(first_op_lines(sim("plain"), 40)):
        record = json.loads(line)
        if i % 3 == 0:
            record["header"]["comm_name"] = None
            record["rankwatch"]["algo"] = None
        lines.append(json.dumps(record))
    shape = native.layout()
    slots = [c.slot for c in shape.columns if (c.group, c.name) in
             {("header", "comm_name"), ("rankwatch", "algo")}]  # fmt: skip
    batches = []
    with native.Reader(shape) as reader:
        for half in (lines[:20], lines[20:]):  # files of their own
            reader._lib.rwp_reset(reader._p)
            chunk = reader.bind_chunk(64)
            buf = np.frombuffer(("\n".join(half) + "\n").encode(), dtype=np.uint8)
            reader._lib.rwp_parse(reader._p, buf.ctypes.data, len(buf), 1)
            chunk, strings = reader._finish_chunk(chunk)
            assert chunk.rows == 20
            for slot in slots:
                nulls = ~native.unpack(chunk.valid[slot], chunk.rows)
                assert nulls.sum() >= 6  # every third line's, and P2P ops have no algo
                assert (chunk.values[slot][: chunk.rows][nulls] == 0).all()
            batches.append(native.to_arrow(shape, chunk, strings, "x", native.comm_keys(strings)))
    table = pa.Table.from_batches(batches)
    combined = table.combine_chunks().unify_dictionaries()
    name = combined.column(native.flat_name("header", "comm_name")).to_pylist()
    assert name == table.column(native.flat_name("header", "comm_name")).to_pylist()
    assert name.count(None) == 14  # every third of the 40 lines


# --------------------------------------------------------------- sanitizers


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler")
def test_mangled_lines_never_crash_the_parser_under_sanitizers(sim, tmp_path: Path) -> None:
    binary = tmp_path / "fuzz_rwparse"
    build_sanitized(binary, ["tests/fuzz_rwparse.c", "rwparse.c"], "-D_GNU_SOURCE")
    spec = tmp_path / "spec.txt"
    spec.write_bytes(native.build_layout().spec)
    seeds = tmp_path / "seeds.txt"
    p2p = [x for x in first_op_lines(sim("plain"), 400) if "p2p_perf" in x][:10]
    unusual = [_reordered(x) for x in first_op_lines(sim("plain"), 5)]
    seeds.write_text("\n".join(first_op_lines(sim("plain"), 40) + p2p + unusual) + "\n")
    for seed in (1, 2):
        run_sanitized(binary, str(spec), str(seeds), "15000", str(seed))


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler")
def test_mangled_state_lines_never_crash_the_parser_or_nested_reader_under_sanitizers(
    sim, tmp_path: Path
) -> None:
    """State records: top-level fields, nested values kept as text and read by the
    nested reader into Arrow buffers, files going on in one chunk."""
    from rankwatch.store import native_state

    binary = tmp_path / "fuzz_rwparse"
    build_sanitized(binary, ["tests/fuzz_rwparse.c", "rwparse.c"], "-D_GNU_SOURCE")
    spec = tmp_path / "spec.txt"
    spec.write_bytes(native_state.layout().spec)
    nested = tmp_path / "nested.txt"
    types = native_state.nested_types().values()
    nested.write_text("\n".join(native_state.nested_spec(t) for t in types) + "\n")
    kinds = _state_lines(sim("hang"))
    busy = [x for x in kinds["progress"] if '"in_flight":[{' in x][:4]
    # maps past 16 keys, whose duplicates are looked up in a table
    wide = [_edited(busy[0], colls={f"Op{i}": {"enqueued": i} for i in range(n)})
            for n in (20, 300)]  # fmt: skip
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join(busy + wide + [v[0] for v in kinds.values()]) + "\n")
    for seed in (1, 2):
        out = run_sanitized(binary, str(spec), str(seeds), "6000", str(seed), str(nested))
        read = re.search(r"(\d+) rows accepted, \d+ lines flagged, (\d+) nested texts read", out)
        assert read is not None and int(read[1]) > 0 and int(read[2]) > 0, out


@needs_library
def test_dropping_files_removes_their_rows_from_held_batches_and_spilled_files(
    sim, tmp_path: Path
) -> None:
    """A file the native reader does not take after all goes through DuckDB's reader:
    its rows leave the held batches and the IPC files it was spilled to."""
    import duckdb

    from rankwatch.store import tables
    from rankwatch.store.discover import discover
    from rankwatch.store.held import HeldOps

    files = [f for f in discover([sim("plain")])[0] if f.role == "ops"]
    con = duckdb.connect()
    tables.create_all(con)
    with file_batches():
        budget = int(0.7 * _ingest(sim("plain"), True).held.nbytes)
        held = HeldOps(budget, str(tmp_path))
        native.load_files(con, files, 2, held=held)
    assert len(held.batches) >= 1 and len(held.files) >= 1
    in_batch = sorted({p for b in held.batches for p in b.column(0).dictionary.to_pylist()})
    before = spilled_sources(held)
    in_file = sorted(before)
    gone = [in_batch[0], in_file[-1]]
    spilled = spilled_rows(held)
    held.drop_files(con, gone)
    held.install(con, native.lean_projection())
    counts = dict(con.execute("SELECT source_file, count(*) FROM ops GROUP BY ALL").fetchall())
    assert not set(gone) & set(counts)
    assert set(counts) == (set(in_batch) | set(in_file)) - set(gone)
    assert spilled_rows(held) == spilled - before[in_file[-1]]
    assert spilled_sources(held) == {p: n for p, n in before.items() if p not in gone}
    assert sum(counts.values()) == held.table.num_rows + spilled_rows(held)


@needs_library
def test_files_of_spilled_rows_go_with_their_connection(sim, tmp_path: Path) -> None:
    import gc

    settings = EngineSettings(spill_parent=str(tmp_path), held_bytes=1)  # all spilled
    store = ingest([sim("plain")], progress=False, settings=settings)
    (directory,) = {Path(f).parent for f in store.held.files}
    assert directory.parent == tmp_path
    assert store.count("ops") == spilled_rows(store.held)
    store.con.close()
    del store
    gc.collect()
    assert not directory.exists()


@needs_library
def test_string_dictionary_holds_each_text_once() -> None:
    """Strings and raw texts of every length around a word's (the hash reads words,
    the last one masked), plain and escaped, repeated in any order and past the
    table's growth: each distinct text gets one code, and every row's code is its
    own text's. A hash that differed between interning and the table's regrowth,
    or read bytes past a text's end, would give a text two codes or the wrong one."""
    rng = random.Random(11)
    alphabet = 'ab\u00e9\u20ac"\\\t/'
    texts = [""] + ["".join(rng.choice(alphabet) for _ in range(n % 41)) for n in range(700)]
    raws = [json.dumps({"k": "x" * n, "v": list(range(n % 7))}) for n in range(0, 300, 3)]
    rows = [(rng.choice(texts), rng.choice(raws)) for _ in range(5000)]
    data = "".join(json.dumps({"s": s, "r": json.loads(r)}) + "\n" for s, r in rows).encode()
    shape = native.Layout(
        b"field . s s 0\nfield . r r 1\n",
        {},
        (native.Column(".", "s", "s", 0), native.Column(".", "r", "r", 1)),
        ("s", "r"),
    )
    buf = np.frombuffer(data, dtype=np.uint8)
    with native.Parser(shape) as parser:
        chunk = parser.bind_chunk(len(rows))
        assert parser.parse(buf.ctypes.data, len(buf)) == len(buf)
        assert parser.rows() == len(rows)
        strings = parser.strings()
    assert len(strings) == len(set(strings))
    raw_texts = [r for _, r in rows]  # as the line has them (json.dumps' separators)
    assert set(strings) == {s for s, _ in rows} | set(raw_texts)
    s_codes, r_codes = chunk.values[0], chunk.values[1]
    assert s_codes is not None and r_codes is not None
    assert [strings[c] for c in s_codes[: len(rows)]] == [s for s, _ in rows]
    assert [strings[c] for c in r_codes[: len(rows)]] == raw_texts


def test_slabs_give_zeroed_aligned_buffers_that_never_overlap() -> None:
    # Given slabs of 64 KiB, and buffers taken from them after writing into earlier ones
    slabs = slabs_module.Slabs(slab_bytes=1 << 16)
    taken = []
    for size in [1, 63, 64, 65, 1000, 4096, 3 * 4096, 20_000, 5, 16_385]:
        buf = slabs.take(size)
        # Then each is zeroed, as long as asked and 64-byte aligned (Arrow's alignment)
        assert len(buf) == size and not buf.any() and buf.ctypes.data % 64 == 0
        buf[:] = 0xAB
        taken.append(buf)
    # and no two share a byte, though several came from one slab and later ones from
    # a new slab (a buffer of over a quarter of a slab from memory of its own)
    spans = sorted((b.ctypes.data, b.ctypes.data + len(b)) for b in taken)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert all((b == 0xAB).all() for b in taken)
    bases = {id(b.base) for b in taken if b.base is not None}
    assert 1 < len(bases) < len(taken)
