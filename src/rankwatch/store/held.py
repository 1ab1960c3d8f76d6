"""Op rows the native reader parsed, kept outside DuckDB's `ops` table: in memory
as Arrow batches up to a budget, the rest written to Arrow IPC files.

Appending a row to a DuckDB table costs about as much as parsing it (1.5 CPU s per
million 43-column op rows), and once the tables pass half the memory limit they
are compressed at about 2.6 s per million more; writing them to uncompressed
Parquet instead (DuckDB's writer or pyarrow's) still costs 1.2 to 1.8 CPU s per
million (bench/RESULTS.md section 4). So an in-memory store keeps the first op
rows the native reader parses as the Arrow batches it made
(`rankwatch.store.native.to_arrow`), until they take `budget` bytes, and writes
each later batch as it is to an uncompressed Arrow IPC file of its own in a private
directory (`spill`), at a third to a quarter of Parquet's cost. Scans read the
held batches within twice the time of DuckDB's own table, and the IPC files,
through a pyarrow dataset, at two to four times the time of a Parquet scan: a
full scan of 8 M spilled rows (10 M records) takes 0.2 s for one column, 2 s for
op_groups's group-by. `install()` then renames the table (the rows of the other
readers) to `ops_appended` and makes `ops` a view of all three. Everything after
ingest only reads `ops`; ingest's own changes to it (removing a file's rows,
numbering Inspector P2P records) happen before the view exists, and removing a
file's rows reaches the batches and files too (`drop_files`). A store kept with
`--store` holds nothing: it is written as tables.

Memory: the held batches count against the memory limit (RANKWATCH_MEMORY_LIMIT):
DuckDB's own limit is lowered by the budget while they are taken (`reserve`), then
by what they take (`install`). The IPC files are on disk (the spill directory's
parent, RANKWATCH_SPILL_DIR), about 270 MB per million op records, removed with
the connection (or when the process exits). Scans read them in record batches of
SPILL_BATCH_ROWS rows, not mapped; pyarrow's batches in flight are outside the
limit (see rankwatch.store.engine.HELD_FRACTION and release_arrow_memory)."""

from __future__ import annotations

import os
import shutil
import weakref
from collections.abc import Iterable
from typing import Any

HELD_TABLE = "ops_held_batches"  # the Arrow table, as DuckDB sees it
SPILLED_TABLE = "ops_spilled_batches"  # the pyarrow dataset of the IPC files
APPENDED_TABLE = "ops_appended"  # the rows of the other readers
# Rows per record batch in the IPC files: smaller batches keep fewer bytes in flight
# when DuckDB scans them through pyarrow (at 10 M records 0.34 GB at 8,192 rows,
# 0.41 at 32,768), for about the same scan time.
SPILL_BATCH_ROWS = 8192


class HeldOps:
    """See module doc. Not thread-safe: only the inserting thread uses it."""

    def __init__(self, budget: int, spill_parent: str | None) -> None:
        self.budget = max(0, int(budget))
        self.spill_parent = spill_parent
        self.batches: list[Any] = []  # pyarrow.RecordBatch
        self.nbytes = 0
        self.open = self.budget > 0  # still taking batches
        self.table: Any = None  # the pyarrow.Table DuckDB scans, once installed
        self.limit: float | None = None  # DuckDB's memory limit before reserve()
        self.files: list[str] = []  # IPC files written
        self.spilled: Any = None  # pyarrow dataset of `files`, once installed
        self._directory: str | None = None

    def reserve(self, con: Any) -> None:
        """Lower DuckDB's memory limit by the budget while batches are taken, so that
        the two together stay within it (install() gives back what was not used)."""
        from rankwatch.store.engine import limit_bytes

        self.limit = limit_bytes(con)
        if self.limit is not None and self.budget:
            self.budget = min(self.budget, int(self.limit / 2))  # DuckDB keeps half
            _set_limit(con, self.limit - self.budget)

    def take(self, batch: Any) -> bool:
        """Hold `batch`; False (and closed for good) once it does not fit the budget,
        so that the caller spills it and every later one."""
        if not self.open:
            return False
        size = batch.get_total_buffer_size()
        if self.nbytes + size > self.budget:
            self.open = False
            return False
        self.batches.append(batch)
        self.nbytes += size
        return True

    def spill(self, con: Any, batches: Iterable[Any]) -> None:
        """Write each of `batches` (to_arrow's) to an IPC file of its own: an IPC file
        holds one dictionary per column, and each batch has its own (its file's)."""
        import pyarrow as pa

        for batch in batches:
            if not self.files:
                # install() reads the files through pyarrow.dataset, whose first
                # import takes 0.1 to 0.2 s: here the inserting thread mostly waits
                # for the parsing threads, after ingest the whole job waits for it
                import pyarrow.dataset  # noqa: F401
            path = os.path.join(self._spill_directory(con), f"ops-{len(self.files):06d}.arrow")
            _write_ipc(path, pa.Table.from_batches([batch]))
            self.files.append(path)

    def spilled_rows(self) -> int:
        """Rows in the IPC files."""
        return sum(_read_ipc(path).num_rows for path in self.files)

    def drop_files(self, con: Any, paths: list[str]) -> None:
        """Remove the rows of these source files (a file the native reader did not
        take goes through DuckDB's reader instead): from the held batches, and from
        the IPC files, rewritten without them."""
        if not paths:
            return
        import pyarrow as pa

        gone = pa.array(sorted(set(paths)), type=pa.string())
        self.batches = [rest for b in self.batches if (rest := _without(b, gone)) is not None]
        self.nbytes = sum(b.get_total_buffer_size() for b in self.batches)
        for path in self.files:
            table = _read_ipc(path)
            rest = _without(table, gone)
            if rest is table:
                continue
            if rest is None:  # nothing left: an empty file of the same schema
                rest = table.slice(0, 0)
            _write_ipc(f"{path}.rest", rest.unify_dictionaries())
            del table
            os.replace(f"{path}.rest", path)

    def install(self, con: Any, projection: str) -> None:
        """Make `ops` the held rows (through `projection`, cast to the table's
        types), the spilled ones and the appended ones; a no-op when there are
        none. DuckDB's memory limit becomes the one before reserve() less the held
        bytes, so that the two together stay within it."""
        if self.limit is not None:
            _set_limit(con, self.limit - self.nbytes)
        if not self.batches and not self.files:
            return
        import pyarrow as pa

        names = ", ".join(f'"{c}"' for c, _ in _columns())
        parts = [f"SELECT {names} FROM {APPENDED_TABLE}"]
        if self.files:
            import pyarrow.dataset as ds

            self.spilled = ds.dataset(self.files, format="ipc")
            con.register(SPILLED_TABLE, self.spilled)
            parts.append(f"SELECT {self._typed()} FROM (SELECT {projection} FROM {SPILLED_TABLE})")
        if self.batches:
            self.table = pa.Table.from_batches(self.batches)
            self.batches = []  # the table holds the same buffers
            con.register(HELD_TABLE, self.table)
            parts.append(f"SELECT {self._typed()} FROM (SELECT {projection} FROM {HELD_TABLE})")
        con.execute(f"ALTER TABLE ops RENAME TO {APPENDED_TABLE}")
        con.execute(f"CREATE VIEW ops AS {' UNION ALL '.join(reversed(parts))}")

    def appended_relation(self) -> str:
        """Where the op rows appended to the table are once installed: the rows of
        the other readers (none of these)."""
        return APPENDED_TABLE if self.table is not None or self.files else "ops"

    def _typed(self) -> str:
        return ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in _columns())

    def _spill_directory(self, con: Any) -> str:
        """A private directory for the Parquet files, removed with the connection
        whose `ops` reads them (or at exit)."""
        if self._directory is None:
            from rankwatch.store.engine import private_path

            path = private_path(self.spill_parent, "ops")
            os.makedirs(path)
            weakref.finalize(con, shutil.rmtree, path, True)
            self._directory = path
        return self._directory


def _columns() -> list[tuple[str, str]]:
    """(name, SQL type) of the columns of `ops`."""
    from rankwatch.store.tables import OP_COLUMNS

    return [(c, t) for c, t, _, _ in OP_COLUMNS]


def _without(data: Any, gone: Any) -> Any:
    """`data` (a RecordBatch or Table of to_arrow's columns) without the rows whose
    source_file is in `gone`: `data` itself when it has none, None when nothing is
    left."""
    import pyarrow.compute as pc

    source = data.column(0)  # source_file, dictionary-encoded
    chunks = source.chunks if hasattr(source, "chunks") else [source]
    if not any(pc.any(pc.is_in(c.dictionary, value_set=gone)).as_py() for c in chunks):
        return data
    rest = data.filter(pc.invert(pc.is_in(source, value_set=gone)))
    return rest if rest.num_rows else None


def _write_ipc(path: str, table: Any) -> None:
    """An uncompressed Arrow IPC file of `table` (one dictionary per column)."""
    import pyarrow as pa

    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=SPILL_BATCH_ROWS)


def _read_ipc(path: str) -> Any:
    """An IPC file as a Table over its mapped pages (no copy)."""
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(path)).read_all()


def _set_limit(con: Any, limit: float) -> None:
    con.execute(f"SET memory_limit = '{int(limit)}B'")
