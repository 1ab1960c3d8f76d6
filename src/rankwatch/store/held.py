"""Op rows the native reader parsed, kept outside DuckDB's `ops` table: in memory
as Arrow batches up to a budget, the rest written to uncompressed Parquet files.

Appending a row to a DuckDB table costs about as much as parsing it (1.5 CPU s per
million 43-column op rows), and once the tables pass half the memory limit they
are compressed at about 2.6 s per million more (bench/RESULTS.md section 4).
DuckDB scans uncompressed Parquet files about as fast as its own table, and Arrow
batches in memory within twice its time. So an in-memory store keeps the first op rows the native
reader parses as the Arrow batches it made (`rankwatch.store.native.to_arrow`),
until they take `budget` bytes, and DuckDB writes the rest, round by round, to
Parquet files in a private directory (`spill`): with the table's column types,
and no compression, which would cost more than it saves when the files are read
back from the page cache. `install()` then renames the table (the rows of the
other readers) to `ops_appended` and makes `ops` a view of all three.
Everything after ingest only reads `ops`; ingest's own changes to it (removing
a file's rows, numbering Inspector P2P records) happen before the view exists,
and removing a file's rows reaches the batches and files too (`drop_files`). A
store kept with `--store` holds nothing: it is written as tables.

Memory: the held batches count against the memory limit (RANKWATCH_MEMORY_LIMIT):
DuckDB's own limit is lowered by the budget while they are taken (`reserve`), then
by what they take (`install`). The Parquet files are on disk (the spill
directory's parent, RANKWATCH_SPILL_DIR), about 100 MB per million op records,
removed with the connection (or when the process exits)."""

from __future__ import annotations

import os
import shutil
import weakref
from typing import Any

HELD_TABLE = "ops_held_batches"  # the Arrow table, as DuckDB sees it
APPENDED_TABLE = "ops_appended"  # the rows of the other readers
SPILL_STREAM = "rankwatch_spill_chunks"


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
        self.files: list[str] = []  # Parquet files written
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

    def spill(self, con: Any, stream: Any, projection: str) -> None:
        """Write the batches of `stream` (a pyarrow RecordBatchReader of to_arrow's
        batches) through `projection`, cast to the table's types, to a new Parquet
        file."""
        path = os.path.join(self._spill_directory(con), f"ops-{len(self.files):05d}.parquet")
        con.register(SPILL_STREAM, stream)
        try:
            rows = con.execute(
                f"COPY (SELECT {self._typed()} FROM (SELECT {projection} FROM {SPILL_STREAM})) "
                f"TO '{_sql_text(path)}' (FORMAT parquet, COMPRESSION uncompressed)"
            ).fetchall()[0][0]
        finally:
            con.unregister(SPILL_STREAM)
        if rows:
            self.files.append(path)
        else:
            os.unlink(path)

    def drop_files(self, con: Any, paths: list[str]) -> None:
        """Remove the rows of these source files (a file the native reader did not
        take goes through DuckDB's reader instead): from the held batches, and from
        the Parquet files, rewritten without them."""
        if not paths:
            return
        self._drop_held(paths)
        listed = ", ".join(f"'{_sql_text(p)}'" for p in sorted(set(paths)))
        for path in self.files:
            source = f"read_parquet('{_sql_text(path)}')"
            hit = f"SELECT 1 FROM {source} WHERE source_file IN ({listed}) LIMIT 1"
            if not con.execute(hit).fetchall():
                continue
            rest = f"{path}.rest"
            con.execute(
                f"COPY (SELECT * FROM {source} WHERE source_file NOT IN ({listed})) "
                f"TO '{_sql_text(rest)}' (FORMAT parquet, COMPRESSION uncompressed)"
            )
            os.replace(rest, path)

    def _drop_held(self, paths: list[str]) -> None:
        if not self.batches:
            return
        import pyarrow as pa
        import pyarrow.compute as pc

        gone = pa.array(sorted(set(paths)), type=pa.string())
        kept = []
        for batch in self.batches:
            source = batch.column(0)  # source_file, dictionary-encoded
            if not pc.any(pc.is_in(source.dictionary, value_set=gone)).as_py():
                kept.append(batch)
                continue
            rest = batch.filter(pc.invert(pc.is_in(source, value_set=gone)))
            if rest.num_rows:
                kept.append(rest)
        self.batches = kept
        self.nbytes = sum(b.get_total_buffer_size() for b in kept)

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
            listed = ", ".join(f"'{_sql_text(p)}'" for p in self.files)
            parts.append(f"SELECT {names} FROM read_parquet([{listed}])")
        if self.batches:
            self.table = pa.Table.from_batches(self.batches)
            self.batches = []  # the table holds the same buffers
            con.register(HELD_TABLE, self.table)
            parts.append(f"SELECT {self._typed()} FROM (SELECT {projection} FROM {HELD_TABLE})")
        con.execute(f"ALTER TABLE ops RENAME TO {APPENDED_TABLE}")
        con.execute(f"CREATE VIEW ops AS {' UNION ALL '.join(reversed(parts))}")

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


def _set_limit(con: Any, limit: float) -> None:
    con.execute(f"SET memory_limit = '{int(limit)}B'")


def _sql_text(text: str) -> str:
    return text.replace("'", "''")
