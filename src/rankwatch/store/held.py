"""Op rows the native reader parsed, held as Arrow batches instead of appended to
DuckDB's `ops` table, up to a memory budget.

Appending a row to a DuckDB table costs about as much as parsing it (1.5 CPU s per
million 43-column op rows, bench/RESULTS.md section 4), while DuckDB scans Arrow
batches in memory as fast as its own uncompressed table. So an in-memory store
keeps the first op rows the native reader parses as the Arrow batches it made
(`rankwatch.store.native.to_arrow`), until they take `budget` bytes; rows past the
budget are appended to the table as before (compressed once it grows, see
engine.compact). `install()` then renames the table to `ops_appended` and makes
`ops` a view: the held batches, through the same projection the append uses, and
the appended rows. Everything after ingest only reads `ops`; ingest's own
changes to it (removing a file's rows, numbering Inspector P2P records) happen
before the view exists, and removing a file's rows reaches the held batches too
(`drop_files`). A store kept with `--store` holds nothing: it is written as
tables.

Memory: the held batches count against the memory limit (RANKWATCH_MEMORY_LIMIT):
DuckDB's own limit is lowered by the budget while they are taken (`reserve`), then
by what they take (`install`)."""

from __future__ import annotations

from typing import Any

HELD_TABLE = "ops_held_batches"  # the Arrow table, as DuckDB sees it
APPENDED_TABLE = "ops_appended"  # the rows past the budget, and the other readers'


class HeldOps:
    """See module doc. Not thread-safe: only the inserting thread uses it."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, int(budget))
        self.batches: list[Any] = []  # pyarrow.RecordBatch
        self.nbytes = 0
        self.open = self.budget > 0  # still taking batches
        self.table: Any = None  # the pyarrow.Table DuckDB scans, once installed
        self.limit: float | None = None  # DuckDB's memory limit before reserve()

    def reserve(self, con: Any) -> None:
        """Lower DuckDB's memory limit by the budget while batches are taken, so that
        the two together stay within it (install() gives back what was not used)."""
        from rankwatch.store.engine import limit_bytes

        self.limit = limit_bytes(con)
        if self.limit is not None and self.budget:
            self.budget = min(self.budget, int(self.limit / 2))  # DuckDB keeps half
            _set_limit(con, self.limit - self.budget)

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def take(self, batch: Any) -> bool:
        """Hold `batch`; False (and closed for good) once it does not fit the budget,
        so that the caller appends it and every later one."""
        if not self.open:
            return False
        size = batch.get_total_buffer_size()
        if self.nbytes + size > self.budget:
            self.open = False
            return False
        self.batches.append(batch)
        self.nbytes += size
        return True

    def only(self, column: str, values: tuple[str, ...]) -> bool:
        """Whether every held row has one of `values` in the dictionary-encoded
        `column` (no NULL)."""
        return all(
            b.column(column).null_count == 0
            and set(b.column(column).dictionary.to_pylist()) <= set(values)
            for b in self.batches
        )

    def drop_files(self, paths: list[str]) -> None:
        """Remove the rows of these source files (a file the native reader did not
        take goes through DuckDB's reader instead)."""
        if not paths or not self.batches:
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

    def install(self, con: Any, projection: str, columns: list[tuple[str, str]]) -> None:
        """Make `ops` the held rows (through `projection`, cast to the table's
        `columns`: (name, SQL type)) and the appended ones; a no-op when nothing is
        held. DuckDB's memory limit becomes the one before reserve() less the held
        bytes, so that the two together stay within it."""
        if self.limit is not None:
            _set_limit(con, self.limit - self.nbytes)
        if not self.batches:
            return
        import pyarrow as pa

        self.table = pa.Table.from_batches(self.batches)
        self.batches = []  # the table holds the same buffers
        con.register(HELD_TABLE, self.table)
        typed = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in columns)
        names = ", ".join(f'"{c}"' for c, _ in columns)
        con.execute(f"ALTER TABLE ops RENAME TO {APPENDED_TABLE}")
        con.execute(
            f"CREATE VIEW ops AS SELECT {typed} FROM (SELECT {projection} FROM {HELD_TABLE}) "
            f"UNION ALL SELECT {names} FROM {APPENDED_TABLE}"
        )


def _set_limit(con: Any, limit: float) -> None:
    con.execute(f"SET memory_limit = '{int(limit)}B'")
