"""Rolling Parquet output (`monitor --parquet DIR`): the records the monitor
processed, in the store's table layout, so the same SQL reads them as reads an
`analyze --store DIR` export.

Rows are buffered per (table, job) and written as one complete zstd file per
flush, `DIR/<table>/job=<job>/part-<time>-<n>.parquet` (Hive partitions), every
`flush_s` seconds or `flush_rows` rows; a file is never left half-written for a
crash to spoil. The buffer is bounded: past `max_rows`, the oldest buffered rows
are dropped and counted (the plugin's files still have them).
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FLUSH_S = 30.0
FLUSH_ROWS = 100_000
MAX_ROWS = 400_000


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._#-]", "_", name) or "_"


class ParquetSink:
    """See module doc."""

    def __init__(
        self,
        directory: Path,
        flush_s: float = FLUSH_S,
        flush_rows: int = FLUSH_ROWS,
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_s, self.flush_rows, self.max_rows = flush_s, flush_rows, max_rows
        self.buffers: dict[tuple[str, str], deque[pa.Table]] = {}
        self.rows = 0
        self.written: dict[str, int] = {}
        self.dropped = 0
        self.files = 0
        self._last = time.monotonic()

    def add(self, job: str, tables: dict[str, pa.Table]) -> None:
        for name, table in tables.items():
            if table.num_rows:
                self.buffers.setdefault((name, job), deque()).append(table)
                self.rows += table.num_rows
        while self.rows > self.max_rows:
            self._drop_oldest()
        if self.rows >= self.flush_rows or time.monotonic() - self._last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        for (name, job), parts in self.buffers.items():
            if parts:
                self._write(name, job, list(parts))
                parts.clear()
        self.rows = 0

    def _write(self, name: str, job: str, parts: list[pa.Table]) -> None:
        table = pa.concat_tables(parts, promote_options="permissive")
        folder = self.directory / name / f"job={_safe(job)}"
        folder.mkdir(parents=True, exist_ok=True)
        self.files += 1
        final = folder / f"part-{int(time.time() * 1000)}-{self.files}.parquet"
        tmp = final.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, final)  # readers never see a partial file
        self.written[name] = self.written.get(name, 0) + table.num_rows

    def _drop_oldest(self) -> None:
        biggest = max(self.buffers.values(), key=lambda q: sum(t.num_rows for t in q))
        table = biggest.popleft()
        self.rows -= table.num_rows
        self.dropped += table.num_rows
