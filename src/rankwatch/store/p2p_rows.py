"""The P2P ops' alignment columns, kept while the native reader parses.

Matching a Send with its Recv (rankwatch.align.p2p) reads a dozen columns of the
P2P ops, a tenth of the op rows or less. Its scan of `ops` for them read every op
row, and at ten million records most are spilled to Arrow IPC files
(rankwatch.store.held): 1.2 to 1.6 s to read back. The parsing threads have the
rows in typed columns: each chunk's P2P rows are picked here (NumPy, a few
columns) and kept per file as Arrow arrays over the file's string dictionary.
align.p2p reads them, and the P2P rows the other readers appended, instead.

A file the native reader hands on to the DuckDB path is dropped again (`drop`),
as its rows are. Valid, like store.grouped's counts, only while every op row the
native reader took is held or spilled rather than appended (the store hands
both over only then).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.store.bitmaps import bits_at

# The ops columns kept (each the ops column of that name as the native reader fills
# it), with their types in `ops`; comm_key is derived from comm_id, kind is 'p2p'.
COLUMNS = (("func", "string"), ("comm_id", "string"), ("comm_name", "string"),
           ("rank", "int32"), ("peer", "int32"), ("seq", "int64"), ("host", "string"),
           ("pid", "int64"), ("msg_bytes", "int64"), ("arrival_ns", "int64"),
           ("gpu_start_ns", "int64"), ("gpu_end_ns", "int64"))  # fmt: skip
KEPT_P2P = "p2p_rows_kept"  # the Run.meta key they are handed over by


@dataclass(frozen=True)
class KeptP2P:
    """What align.p2p reads instead of the P2P rows of `ops`."""

    table: Any  # pyarrow.Table: COLUMNS, comm_key and kind, of the native reader's rows
    rest: str  # the relation of the op rows the other readers appended


class P2PCapture:
    """The P2P rows of the native reader's chunks, per file (thread-safe: a file is
    read by one thread)."""

    def __init__(self, slots: dict[str, int]) -> None:
        """slots: the layout slot of `kind` and of each of COLUMNS."""
        self._slots = slots
        self._files: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def add(self, path: str, chunk: Any, strings: list[str], keys: list[str | None]) -> None:
        """Keep the P2P rows of one parsed chunk of `path` (a native.Chunk whose rows
        passed the reader's checks: every one a rankwatch op of kind coll or p2p)."""
        if "p2p" not in strings or chunk.rows == 0:
            return
        kinds = chunk.values[self._slots["kind"]][: chunk.rows]
        rows = np.flatnonzero(kinds == strings.index("p2p"))
        if len(rows) == 0:
            return
        part = _part(chunk, rows, strings, keys, self._slots)
        with self._lock:
            self._files.setdefault(path, []).append(part)

    def drop(self, path: str) -> None:
        """Forget what was kept of `path` (the file goes through the DuckDB path)."""
        with self._lock:
            self._files.pop(path, None)

    def finish(self) -> Any:
        """The kept rows of every file as one Arrow table (schema())."""
        import pyarrow as pa

        parts = [p for path in sorted(self._files) for p in self._files[path]]
        self._files = {}
        return pa.Table.from_batches(parts, schema=schema())


def schema() -> Any:
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string())
    fields = [(name, text if kind == "string" else getattr(pa, kind)()) for name, kind in COLUMNS]
    return pa.schema([*fields, ("comm_key", text), ("kind", text)])


def _part(
    chunk: Any, rows: np.ndarray, strings: list[str], keys: list[str | None], slots: dict[str, int]
) -> Any:
    """The chunk's `rows` as a record batch of schema()."""
    import pyarrow as pa

    dictionary = pa.array(strings, type=pa.string())
    arrays = []
    for name, kind in COLUMNS:
        bits = chunk.valid[slots[name]]
        missing = bits_at(bits, rows) == 0
        values = chunk.values[slots[name]][rows]
        if kind == "string":
            indices = pa.array(values.astype(np.int32), mask=missing)
            arrays.append(pa.DictionaryArray.from_arrays(indices, dictionary, safe=False))
        else:
            arrays.append(pa.array(values.astype(kind), mask=missing))
    ids = arrays[1].indices
    arrays.append(pa.DictionaryArray.from_arrays(ids, pa.array(keys, type=pa.string()), safe=False))
    p2p = pa.array(["p2p"], type=pa.string())
    arrays.append(pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(rows), np.int32)), p2p))
    return pa.RecordBatch.from_arrays(arrays, schema=schema())
