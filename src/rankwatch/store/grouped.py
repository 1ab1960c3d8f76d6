"""`op_groups` counted while the native reader parses.

rankwatch.align.groups makes `op_groups` (the ops counted per communicator,
rank, process, device, function, kind, format and job, with a few extremes) by a
scan of `ops`. At ten million records most op rows are spilled to Arrow IPC files
(rankwatch.store.held), and reading them back for that scan took about 2 s. The
parsing threads have every row in typed columns already: rwp_groups (native/
rwparse.c) groups each chunk's rows in C, the GIL released, and this module keeps
the few groups per chunk, per file, as partial counts. align.groups merges them
with a count of the rows the other readers appended (their sums, maxima and
minima combine), for the same table.

The groups are finer than op_groups's: by the communicator's id and name as well
as its key (both constant within a communicator; merged by max, as op_groups
takes them). A file the native reader hands on to the DuckDB path is dropped
again (`drop`), as its rows are.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.store.bitmaps import bits_at

# The chunk columns rwp_groups reads, in native/rwkept.h's RW_G_* order: the
# grouping columns, then those it aggregates (each the ops column of that name as
# the native reader fills it).
GROUP_COLUMNS = ("comm_id", "comm_name", "rank", "host", "pid", "device", "func", "kind",
                 "job_id", "n_ranks", "nnodes", "arrival_ns", "gpu_end_ns", "enqueue_end_ns",
                 "gpu_start_ns")  # fmt: skip
KEY_COLUMNS = GROUP_COLUMNS[:9]
STRING_COLUMNS = ("comm_id", "comm_name", "host", "func", "kind", "job_id")
# What it keeps per group (RW_A_*), as op_groups names them
AGGREGATES = ("n_ranks", "nnodes", "first_arrival_ns", "last_end_ns", "first_timed_start_ns",
              "last_timed_end_ns")  # fmt: skip
# op_groups's columns and their types (align.groups.COUNT_SQL's output)
COLUMNS = (("comm_key", "string"), ("rank", "int32"), ("host", "string"), ("pid", "int64"),
           ("device", "int32"), ("func", "string"), ("kind", "string"),
           ("source_format", "string"), ("job_id", "string"), ("ops", "int64"),
           ("comm_id", "string"), ("comm_name", "string"), ("n_ranks", "int32"),
           ("nnodes", "int32"), ("first_arrival_ns", "int64"), ("last_end_ns", "int64"),
           ("first_timed_start_ns", "int64"), ("last_timed_end_ns", "int64"))  # fmt: skip
FIRST_CAPACITY = 256  # groups per chunk rwp_groups makes room for at first
KEPT_GROUPS = "op_groups_kept"  # the Run.meta key they are handed over by


@dataclass(frozen=True)
class KeptGroups:
    """What align.groups merges into op_groups."""

    table: Any  # pyarrow.Table of COLUMNS: partial groups of the native reader's rows
    rest: str  # the relation of the op rows the other readers appended


class GroupCapture:
    """Partial op_groups of the native reader's chunks, per file (thread-safe: a
    file is read by one thread)."""

    def __init__(self, slots: dict[str, int], lib: ctypes.CDLL) -> None:
        """slots: the layout slot of each of GROUP_COLUMNS; lib: the native reader's
        library (rwp_groups)."""
        self._slots = [slots[name] for name in GROUP_COLUMNS]
        self._index = {name: slots[name] for name in GROUP_COLUMNS}
        self._lib = lib
        self._files: dict[str, list[tuple[Any, ...]]] = {}

    def add(self, path: str, chunk: Any, strings: list[str], keys: list[str | None]) -> None:
        """Count the rows of one parsed chunk of `path` (a native.Chunk whose rows
        passed the reader's checks: every one a rankwatch op of kind coll or p2p)."""
        rows = chunk.rows
        if rows == 0:
            return
        n, first, count, agg, valid = self._groups(path, chunk)
        parts = self._files.setdefault(path, [])
        columns = {name: self._column(chunk, name, first, strings) for name in KEY_COLUMNS}
        ids = chunk.values[self._index["comm_id"]][first]
        has_id = bits_at(chunk.valid[self._index["comm_id"]], first).tolist()
        pairs = zip(ids.tolist(), has_id, strict=True)
        columns["comm_key"] = [keys[i] if h else None for i, h in pairs]
        kept = [
            [v if (b >> a) & 1 else None for v, b in zip(agg[a][:n].tolist(), valid, strict=True)]
            for a in range(len(AGGREGATES))
        ]
        n_ranks, nnodes, first_arrival, last_end, timed_start, timed_end = kept
        for g in range(n):
            parts.append((
                columns["comm_key"][g], columns["rank"][g], columns["host"][g],
                columns["pid"][g], columns["device"][g], columns["func"][g],
                columns["kind"][g], "rankwatch", columns["job_id"][g], int(count[g]),
                columns["comm_id"][g], columns["comm_name"][g], n_ranks[g], nnodes[g],
                first_arrival[g], last_end[g], timed_start[g], timed_end[g],
            ))  # fmt: skip

    def _groups(self, path: str, chunk: Any) -> tuple[int, Any, Any, list[Any], list[int]]:
        """rwp_groups over the chunk: (groups, a row of each, their row counts, the
        aggregates, their validity bits)."""
        rows = chunk.rows
        values = (ctypes.c_void_p * len(self._slots))(
            *[chunk.values[k].ctypes.data for k in self._slots]
        )
        valid = (ctypes.c_void_p * len(self._slots))(
            *[chunk.valid[k].ctypes.data for k in self._slots]
        )
        capacity = min(rows, FIRST_CAPACITY)
        while True:
            first = np.empty(capacity, dtype=np.int32)
            count = np.empty(capacity, dtype=np.int64)
            agg = [np.empty(capacity, dtype=np.int64) for _ in AGGREGATES]
            bits = np.empty(capacity, dtype=np.uint8)
            out = (ctypes.c_void_p * len(agg))(*[a.ctypes.data for a in agg])
            n = int(self._lib.rwp_groups(rows, values, valid, capacity, first.ctypes.data,
                                         count.ctypes.data, out, bits.ctypes.data))  # fmt: skip
            if n >= 0:
                return n, first[:n], count[:n], agg, bits[:n].tolist()
            if capacity >= rows:
                raise MemoryError(f"{path}: no memory to group a chunk's ops")
            capacity = min(rows, capacity * 16)

    def _column(self, chunk: Any, name: str, rows: Any, strings: list[str]) -> list[Any]:
        """Column `name` at `rows`: values, strings for codes, None where NULL."""
        slot = self._index[name]
        has = bits_at(chunk.valid[slot], rows).tolist()
        values = chunk.values[slot][rows].tolist()
        if name in STRING_COLUMNS:
            return [strings[v] if h else None for v, h in zip(values, has, strict=True)]
        return [v if h else None for v, h in zip(values, has, strict=True)]

    def drop(self, path: str) -> None:
        """Forget what was counted of `path` (the file goes through the DuckDB path)."""
        self._files.pop(path, None)

    def finish(self) -> Any:
        """The partial groups of every file as an Arrow table of op_groups's columns."""
        import pyarrow as pa

        rows = [row for path in sorted(self._files) for row in self._files[path]]
        self._files = {}
        schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMNS])
        columns = list(zip(*rows, strict=True)) if rows else [[] for _ in COLUMNS]
        arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
        return pa.table(arrays, schema=schema)

