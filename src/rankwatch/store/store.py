"""The Store: a DuckDB connection holding a job's records as flat tables, and
what went wrong reading them. `ingest()` builds one; `--store PATH` keeps it
as a DuckDB file (`.duckdb`/`.db`) or a directory of zstd Parquet files."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwatch.errors import ConfigError
from rankwatch.model import BASE_TABLES, Problem, Run
from rankwatch.store import background, native, native_state, tables
from rankwatch.store.captured import CollectiveCapture, CollectiveColumns
from rankwatch.store.discover import RecordFile, Skipped, discover
from rankwatch.store.engine import (
    EngineSettings,
    compact,
    configure,
    held_budget,
    use_compressed_memory,
)
from rankwatch.store.grouped import KEPT_GROUPS, GroupCapture, KeptGroups
from rankwatch.store.held import HeldOps
from rankwatch.store.ingest import (
    derive_inspector_fields,
    ingest_ops,
    ingest_state,
    new_tmpdir,
    timed,
)
from rankwatch.store.load import insert_rows
from rankwatch.store.p2p_rows import KEPT_P2P, KeptP2P, P2PCapture
from rankwatch.store.problems import ProblemLog
from rankwatch.store.progress import Reporter, reporter_for

DUCKDB_SUFFIXES = (".duckdb", ".db")
# threads that parse the state files while the op files are read: two took more
# CPU time than one at 10 M records on two cores, beside the op files' threads
STATE_WORKERS = 1


@dataclass
class Store:
    con: Any  # duckdb.DuckDBPyConnection
    files: list[RecordFile]
    skipped: list[Skipped]
    problems: list[Problem]
    path: str | None = None
    careful_files: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    native_files: list[str] = field(default_factory=list)  # read by the native reader
    # the collective ops' alignment columns, kept by the native reader (see
    # rankwatch.store.captured; rankwatch.align checks their number against op_groups)
    collectives_kept: CollectiveColumns | None = None
    # the ops counted per op_groups's columns as the native reader parsed them
    # (rankwatch.store.grouped; align.groups merges them into op_groups)
    op_groups_kept: KeptGroups | None = None
    # the P2P ops' alignment columns, likewise (rankwatch.store.p2p_rows; align.p2p)
    p2p_kept: KeptP2P | None = None
    # op rows `ops` reads from Arrow (rankwatch.store.held), kept alive with the store
    held: HeldOps | None = None

    def count(self, table: str) -> int:
        return int(self.con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])

    @property
    def usable(self) -> bool:
        """Whether anything was loaded at all (ops or state records)."""
        return any(self.count(t) for t in ("ops", "comms", "progress", "clock", "stats"))

    def run(self) -> Run:
        meta = {
            "files": len(self.files),
            "skipped": [s.__dict__ for s in self.skipped],
            "careful_files": self.careful_files,
            "timings": dict(self.timings),
        }
        if self.collectives_kept is not None:  # handed over: align uses, then drops them
            meta["collectives_kept"], self.collectives_kept = self.collectives_kept, None
        if self.op_groups_kept is not None:  # likewise (align.groups)
            meta[KEPT_GROUPS], self.op_groups_kept = self.op_groups_kept, None
        if self.p2p_kept is not None:  # likewise (align.p2p)
            meta[KEPT_P2P], self.p2p_kept = self.p2p_kept, None
        return Run(self.con, {t: t for t in BASE_TABLES}, meta, list(self.problems), self.path)


def _is_duckdb_file(path: str) -> bool:
    return path.endswith(DUCKDB_SUFFIXES)


def _connect(store_path: str | None, settings: EngineSettings) -> tuple[Any, str | None]:
    """A connection to load into: in memory, or a temporary file next to the store;
    memory-bounded, spilling to a private directory (see engine.py)."""
    import duckdb

    target = None
    if store_path and _is_duckdb_file(store_path):
        target = f"{store_path}.tmp-{os.getpid()}"
        for leftover in (target, f"{target}.wal"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    con = duckdb.connect(target or ":memory:")
    configure(con, settings)
    if target is None:
        use_compressed_memory(con)
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = true")  # progress is polled, not printed
    con.execute("SET enable_progress_bar_print = false")
    return con, target


def _query_fraction(con: Any):
    def fraction() -> float | None:
        percent = con.query_progress()
        return percent / 100.0 if percent >= 0 else None

    return fraction


def _record_files_table(
    con: Any,
    files: list[RecordFile],
    log: ProblemLog,
    careful: list[str],
    kept: tuple[dict[str, int], str] | None = None,
) -> None:
    """The `files` and `problems` tables. kept: (op rows per file, relation of the
    rest) when the native reader's op rows are held outside the table (store.held):
    their counts are known, and counting them again would read the spilled rows
    back (a tenth of a second per million at 3 M records)."""
    counts: dict[str, int] = dict(kept[0]) if kept else {}
    ops = kept[1] if kept else "ops"
    for table in (ops, "comms", "progress", "clock", "stats"):
        for path, n in con.execute(
            f"SELECT source_file, count(*) FROM {table} GROUP BY source_file"
        ).fetchall():
            counts[path] = counts.get(path, 0) + int(n)
    rows = [
        {
            "path": f.path,
            "role": f.role,
            "format": f.format,
            "bytes": f.size,
            "records": counts.get(f.path, 0),
            "bad_lines": log.bad_lines.get(f.path, 0),
            "reader": "python" if f.path in careful else "duckdb",
        }
        for f in files
    ]
    insert_rows(con, "files", rows)
    insert_rows(con, "problems", [p.to_dict() for p in log.problems()])


def save(con: Any, store_path: str, tmp_db: str | None, settings: EngineSettings) -> Any:
    """Keep the store at store_path; returns the connection to use afterwards."""
    import duckdb

    if tmp_db is not None:
        con.execute("CHECKPOINT")
        con.close()
        os.replace(tmp_db, store_path)
        con = duckdb.connect(store_path)
        configure(con, settings)
        return con
    out = Path(store_path)
    if out.exists() and any(out.iterdir()) and not (out / "schema.sql").exists():
        raise ConfigError(f"--store {store_path}: exists and is not a rankwatch Parquet store")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    con.execute(f"EXPORT DATABASE '{tmp.as_posix()}' (FORMAT parquet, COMPRESSION zstd)")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return con


def ingest(
    paths: list[str | os.PathLike[str]],
    store_path: str | os.PathLike[str] | None = None,
    progress: bool | Reporter = True,
    settings: EngineSettings | None = None,
) -> Store:
    """Load every record file under paths into a new Store (see module doc).

    settings: DuckDB's memory limit, spill directory and threads (default: from
    the RANKWATCH_* environment variables, see rankwatch.store.engine)."""
    reporter = reporter_for(progress)
    timings: dict[str, float] = {}
    store_str = os.fspath(store_path) if store_path is not None else None
    with timed(timings, "discover"):
        files, skipped = discover(list(paths))
    settings = settings or EngineSettings.from_env()
    con, tmp_db = _connect(store_str, settings)
    tables.create_all(con)
    log = ProblemLog()
    ops = [f for f in files if f.role == "ops"]
    state = [f for f in files if f.role == "state"]
    with new_tmpdir() as tmpdir:
        with (
            timed(timings, "ops"),
            reporter.step(f"reading {len(ops)} op record file(s)", _query_fraction(con)),
        ):
            workers = settings.native_workers()
            capture = held = groups = p2p = None
            if workers:
                shape, lib = native.layout(), native.load_library()
                capture = CollectiveCapture(native.capture_slots(shape), lib)
                budget = held_budget(con, settings)
                if store_str is None and budget:  # a kept store is written as tables
                    held = HeldOps(budget, settings.spill_parent)
                    held.reserve(con)
                    # kept as parsed: no native row goes to the table then
                    groups = GroupCapture(native.group_slots(shape), lib)
                    p2p = P2PCapture(native.p2p_slots(shape))
            keepers = [k for k in (capture, groups, p2p) if k is not None]
            # the state files meanwhile, by one thread of their own, where no table is
            # compacted while the op files are read (the op rows are held instead)
            states = None
            if held is not None and state:
                states = native_state.load_files_in_background(con, state, STATE_WORKERS)
            try:
                careful, native_rows = ingest_ops(con, ops, log, tmpdir, workers, held, keepers)
            except BaseException:
                if states is not None:  # done with the connection before it goes
                    with contextlib.suppress(Exception):
                        states()
                raise
            if states is None:
                compact(con)
            native_files = list(native_rows)
            # every kept collective row is in: joined while the tables are finished
            collectives = background.start(capture.finish) if capture is not None else None
        with timed(timings, "state"), reporter.step(f"reading {len(state)} state file(s)"):
            redo, native_state_files = ingest_state(con, state, log, tmpdir, workers, states)
            careful += redo
            native_files += native_state_files
    derive_inspector_fields(con)
    kept = None
    if held is not None:  # from here on `ops` is only read
        held.install(con, native.lean_projection())
        kept = native_rows, held.appended_relation()
    _record_files_table(con, files, log, careful, kept)
    compact(con)
    if store_str is not None:
        with timed(timings, "save"), reporter.step(f"saving the store to {store_str}"):
            con = save(con, store_str, tmp_db, settings)
    store = Store(
        con, files, skipped, log.problems(), store_str, careful, timings, native_files, held=held
    )
    if collectives is not None:
        store.collectives_kept = collectives()
    if held is not None and groups is not None and p2p is not None:  # made with `held`
        store.op_groups_kept = KeptGroups(groups.finish(), held.appended_relation())
        store.p2p_kept = KeptP2P(p2p.finish(), held.appended_relation())
    return store
