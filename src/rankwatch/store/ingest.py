"""ingest(): record files in, a DuckDB store with flat tables out.

1. find the files (discover.py); 2. read the op files of rankwatch records with
the native reader (native.py: parsing threads, one streaming INSERT), which
takes a file whole or not at all; 3. load every line of the other op files in
one multi-threaded DuckDB scan, leniently (a damaged line becomes a row of kind
'undecodable'); 4. per file, count rows that are not op records, lack key
columns or come from a newer schema; 5. re-read only the files with any such
row with the careful line reader, which reports each bad line once and loads
the rest (a file whose only damage is a truncated last line is accepted as is,
with that line reported, by either reader); 6. state files with the native reader
(native_state.py) where it takes them whole, the others with DuckDB's reader (as
JSON objects typed with json_transform: load.read_objects_sql) the same way,
checked against their line counts; 7. derive what Inspector
records lack. Both readers give the same tables (tests/analysis/test_native_reader.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import duckdb

from rankwatch.store import load, native, native_state
from rankwatch.store.checks import check_op, check_state
from rankwatch.store.discover import RecordFile
from rankwatch.store.engine import compact
from rankwatch.store.held import HeldOps
from rankwatch.store.lines import clean_file, count_lines
from rankwatch.store.problems import ProblemLog

TRUNCATED = "truncated last line (the writer stopped mid-line, e.g. the process was killed)"


def _last_line_broken(rf: RecordFile) -> bool:
    """Whether a plain file's last (unterminated) line fails to decode."""
    if rf.compressed:
        return False
    with open(rf.path, "rb") as stream:
        stream.seek(max(0, rf.size - (1 << 20)))
        tail = stream.read().rsplit(b"\n", 1)[-1]
    try:
        json.loads(tail)
    except ValueError:
        return True
    return False


def _verdict(
    rf: RecordFile, loaded: int, bad: int, lines: tuple[int, bool], log: ProblemLog
) -> bool:
    """True when the fast path took the whole file (noting a truncated last line)."""
    total, ends_with_newline = lines
    if bad:
        return False
    if loaded == total:
        return True
    if loaded == total - 1 and not ends_with_newline and _last_line_broken(rf):
        log.add(rf.path, total, "truncated", TRUNCATED)
        return True
    return False


def _op_file_ok(rf: RecordFile, c: load.OpFileCounts, log: ProblemLog) -> bool:
    """True when the fast path took the whole op file (noting a truncated last line)."""
    if c.clean:
        return True
    only_last_line = c.undecodable == 1 and not (c.null_keys or c.newer or c.other)
    if only_last_line and _last_line_broken(rf):
        total, ends_with_newline = count_lines(rf)
        if not ends_with_newline:
            log.add(rf.path, total, "truncated", TRUNCATED)
            return True
    return False


def _careful(con: Any, rf: RecordFile, log: ProblemLog, tmpdir: str) -> None:
    """Line by line: report bad lines, load the good ones through the fast path."""
    check = check_op if rf.role == "ops" else check_state
    clean = clean_file(rf, check, log, tmpdir)
    try:
        if rf.role == "ops":
            load.load_ops(con, [clean.path], lenient=False, source=load.sql_str(rf.path))
            load.insert_rows(
                con,
                "stats",
                [dict(r, source_file=rf.path, source_format="inspector") for r in clean.extra_rows],
            )
        elif clean.lines:
            load.stage_state(
                con,
                [clean.path],
                lenient=False,
                source=load.sql_str(rf.path),
                table="raw_state_careful",
            )
            load.distribute_state(con, [], table="raw_state_careful")
    except Exception as exc:  # duckdb raises its own error classes; report, keep going
        if rf.role != "ops":  # nothing of the file stays: no table holds part of it
            with contextlib.suppress(Exception):
                load.delete_state_files(con, [rf.path])
                con.execute("DROP TABLE IF EXISTS raw_state_careful")
        # name the user's file, not the temporary copy of its good lines
        why = str(exc).replace(clean.path, rf.path)
        log.add(rf.path, None, "unreadable", f"could not load the file's good lines: {why}")
    finally:
        os.unlink(clean.path)


def _load_op_files(con: Any, files: list[RecordFile]) -> dict[str, load.OpFileCounts]:
    """DuckDB's reader over op files; files of rankwatch records are read the lean way,
    and read again in full if they turn out to hold Inspector records too."""
    if not files:
        return {}
    lean = [f.path for f in files if f.format == "rankwatch"]
    full = [f.path for f in files if f.format != "rankwatch"]
    _, broken = load.without_unreadable(lean, lambda ps: load.load_ops(con, ps, lean=True))
    _, also = load.without_unreadable(full, lambda ps: load.load_ops(con, ps))
    broken += also
    full = [p for p in full if p not in also]
    per_file = load.op_file_stats(con)
    mixed = [p for p in lean if per_file.get(p, load.OpFileCounts()).inspector]
    if mixed:
        load.delete_files(con, "ops", mixed)
        load.load_ops(con, mixed)
        full += mixed
        per_file = load.op_file_stats(con)
    load.load_dump_stats(con, full)
    for path in broken:  # nothing of it loaded: the careful reader takes it
        per_file[path] = load.OpFileCounts(unreadable=True)
    return per_file


def _load_native(
    con: Any,
    files: list[RecordFile],
    workers: int,
    held: HeldOps | None = None,
    keepers: Sequence[native.Keeper] = (),
) -> dict[str, native.FileOutcome]:
    """The native reader over the files of rankwatch records (see native.py); the
    outcomes of the files it took whole, or whole but for a truncated last line
    (`held` keeps their rows outside the table, `keepers` what they need of them).
    Tables are compressed between rounds once they grow large (engine.compact)."""
    mine = [f for f in files if f.format == "rankwatch"]
    if not workers or not mine:
        return {}
    outcomes = native.load_files(
        con, mine, workers, between=lambda: compact(con), held=held, keepers=keepers
    )
    taken = {}
    for f in mine:
        outcome = outcomes[f.path]
        if outcome.clean or (outcome.truncated_candidate and _last_line_broken(f)):
            taken[f.path] = outcome
            continue
        if outcome.rows and not outcome.reject:  # it goes through DuckDB's reader
            native.drop_rows(con, held, [f.path])
        for keeper in keepers:
            keeper.drop(f.path)
    return taken


def ingest_ops(
    con: Any,
    files: list[RecordFile],
    log: ProblemLog,
    tmpdir: str,
    native_workers: int = 0,
    held: HeldOps | None = None,
    keepers: Sequence[native.Keeper] = (),
) -> tuple[list[str], dict[str, int]]:
    """Load op files; returns the paths that needed the careful reader, and the op
    rows of each file the native reader took (in file order).

    native_workers > 0: files of rankwatch records go through the native reader
    with that many parsing threads first (their rows kept by `held` rather than
    appended, and by the keepers what each needs of them);
    whatever it does not take whole goes through DuckDB's reader as before.
    Problems are reported in file order either way."""
    taken = _load_native(con, files, native_workers, held, keepers)
    rest = [f for f in files if f.path not in taken]
    per_file = _load_op_files(con, rest)
    redo = []
    for f in files:
        outcome = taken.get(f.path)
        if outcome is not None:
            if outcome.truncated_candidate:
                total, _ = count_lines(f)
                log.add(f.path, total, "truncated", TRUNCATED)
        elif not _op_file_ok(f, per_file.get(f.path, load.OpFileCounts()), log):
            redo.append(f)
    load.delete_files(con, "ops", [f.path for f in redo])
    load.delete_files(con, "stats", [f.path for f in redo])
    if rest:
        load.drop_non_ops(con)
    for f in redo:
        _careful(con, f, log, tmpdir)
    return [f.path for f in redo], {f.path: taken[f.path].rows for f in files if f.path in taken}


def ingest_state(
    con: Any,
    files: list[RecordFile],
    log: ProblemLog,
    tmpdir: str,
    native_workers: int = 0,
    native_taken: Callable[[], dict[str, native.FileOutcome]] | None = None,
) -> tuple[list[str], list[str]]:
    """Load state files; returns the paths that needed the careful reader, and those
    the native reader took (native_workers > 0: with that many parsing threads, or
    already under way: `native_taken`, from native_state.load_files_in_background).
    Whatever it does not take whole goes through DuckDB's reader as before."""
    if native_taken is not None:
        taken = native_taken()
    elif native_workers:
        taken = native_state.load_files(con, files, native_workers)
    else:
        taken = {}
    return _ingest_state_duckdb(con, [f for f in files if f.path not in taken], log, tmpdir), [
        f.path for f in files if f.path in taken
    ]


def _ingest_state_duckdb(
    con: Any, files: list[RecordFile], log: ProblemLog, tmpdir: str
) -> list[str]:
    """State files through DuckDB's reader, files with bad lines through the careful one."""
    if not files:
        return []
    with ThreadPoolExecutor(max_workers=1) as pool:
        counting = pool.submit(lambda: {f.path: count_lines(f) for f in files})
        staged, broken = load.without_unreadable(
            [f.path for f in files], lambda ps: load.stage_state(con, ps)
        )
        lines = counting.result()
    per_file = staged or {}
    redo = [
        f
        for f in files
        if f.path in broken or not _verdict(f, *per_file.get(f.path, (0, 0)), lines[f.path], log)
    ]
    if staged is not None:
        try:
            load.distribute_state(con, [f.path for f in redo])
        except duckdb.Error:  # a value no table takes: each file alone, the careful
            # way, which reports the file that has it and loads the others
            load.delete_state_files(con, [f.path for f in files])
            con.execute("DROP TABLE IF EXISTS raw_state")
            redo = list(files)
    for f in redo:
        _careful(con, f, log, tmpdir)
    return [f.path for f in redo]


def derive_inspector_fields(con: Any) -> None:
    """Inspector P2P records carry no per-pair order: number them per (process, comm,
    func, peer) by p2p_sn, which is what rankwatch's `seq` means for P2P."""
    con.execute(
        "UPDATE ops SET seq = t.rn FROM (SELECT rowid AS rid, row_number() OVER (PARTITION BY "
        "host, pid, comm_key, func, peer ORDER BY p2p_sn) - 1 AS rn FROM ops "
        "WHERE kind = 'p2p' AND seq IS NULL) AS t WHERE ops.rowid = t.rid"
    )


def new_tmpdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="rankwatch-ingest-")


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """`with timed(t, "x"):` adds the block's seconds to t["x"]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
