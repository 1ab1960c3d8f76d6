"""The native reader of op-record files: librankwatch-rwparse (native/), loaded
with ctypes, turns lines of rankwatch records into Arrow chunks that DuckDB
appends to `ops` with the same SQL projection as its own JSON reader.

The library is a strict JSON tokenizer for the op-record layout: keys in any
order, unknown keys (nested values too) skipped, nulls, escapes, numbers as
int or float. It fills one typed column per field the ops table needs, interns
strings into a small per-file dictionary (Arrow dictionary arrays, no Python
object per record), and flags every line it cannot take as it is: invalid
JSON, a wrongly typed or out-of-range field, a duplicate key, Inspector-only
objects. A file with any flagged line, or with a record the DuckDB reader
would not count as a clean op (a missing key column, a newer schema, a record
without the `rankwatch` object), is handed back whole to the DuckDB path (and
from there, as before, to the careful line reader that reports each bad line),
so both paths give identical tables. The one exception is a truncated last
line, which both accept with the same problem report.

Small files (a thousand ranks' files of a few hundred records) are read in
units: runs of them parsed into one chunk, made into one Arrow batch and handed
to the keepers once (units(), Reader.read_unit); a unit with any file that is
not clean is read again file by file, which says what is wrong.

Only files of rankwatch records (RecordFile.format == "rankwatch") are read
here; Inspector files keep going through DuckDB's reader. Without the library
(a source checkout that was never built) everything goes through DuckDB.
RANKWATCH_NATIVE=0 (rankwatch.store.engine) uses the DuckDB path on purpose.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gzip
import itertools
import mmap
import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rankwatch import nativelib, schema
from rankwatch.store import captured, grouped, p2p_rows
from rankwatch.store.discover import RecordFile
from rankwatch.store.held import HeldOps
from rankwatch.store.slabs import Slabs
from rankwatch.store.tables import OP_COLUMNS, OP_GROUP_FIELDS, op_json_columns

LIB_FILENAME = "librankwatch-rwparse.so"
FIT_SLACK = 1.25  # a chunk whose buffers exceed its rows by more is copied to fit
CHUNK_ROWS = 1 << 15  # rows per Arrow batch: about 12 MB of column buffers
MIN_FIRST_ROWS = 256  # ... and at least this many in a file's first (see Reader._first_rows)
SMALL_RECORD_BYTES = 256  # an op record is about 1.2 KB; shorter ones exist (few fields)
READ_WHOLE_BYTES = 1 << 22  # plain files up to this size are read, larger ones mapped
UNIT_BYTES = 1 << 24  # files of up to READ_WHOLE_BYTES are read in units of this many
UNIT_FILES = 1 << 12  # ... bytes and files at most (see units())
UNIT_READ_BYTES = 1 << 20  # a unit's plain files up to this size are read, larger ones mapped
ROUND_ROWS = 1 << 19  # rows per INSERT statement (see load_files)
GZIP_BLOCK = 1 << 23
GZIP_RATIO = 12  # bytes of records per byte of a gzip file, for sizing (about 10 measured)
MAX_FLAGS = 64  # RWP_MAX_FLAGS

# rwparse.h's enum rwp_code
FLAG_NAMES = {
    1: "syntax",
    2: "type",
    3: "range",
    4: "duplicate",
    5: "rejected",
    6: "depth",
    7: "encoding",
    8: "strings",
    9: "not_object",
}

SQL_TO_CODE = {"BIGINT": "i", "DOUBLE": "f", "VARCHAR": "s", "BOOLEAN": "b"}


# ------------------------------------------------------------------ library


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    c_p = ctypes.c_void_p
    i64 = ctypes.c_int64
    sigs = {
        "rwp_new": (c_p, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]),
        "rwp_free": (None, [c_p]),
        "rwp_reset": (None, [c_p]),
        "rwp_next_file": (None, [c_p]),
        "rwp_slot_count": (ctypes.c_int, [c_p]),
        "rwp_bind": (ctypes.c_int, [c_p, i64, c_p, c_p]),
        "rwp_parse": (i64, [c_p, c_p, i64, ctypes.c_int]),
        "rwp_rows": (i64, [c_p]),
        "rwp_lines": (i64, [c_p]),
        "rwp_flagged": (i64, [c_p]),
        "rwp_flag": (ctypes.c_int, [c_p, ctypes.c_int, ctypes.POINTER(i64),
                                    ctypes.POINTER(ctypes.c_int)]),
        "rwp_unterminated_line": (i64, [c_p]),
        "rwp_string_count": (ctypes.c_int32, [c_p]),
        "rwp_string": (c_p, [c_p, ctypes.c_int32, ctypes.POINTER(i64)]),
        "rwp_strings": (c_p, [c_p, c_p, ctypes.POINTER(i64)]),
        "rwp_capture": (i64, [i64, c_p, c_p, ctypes.c_int32, c_p, i64, c_p, c_p, c_p, c_p,
                              c_p, c_p, c_p, c_p]),
        "rwp_groups": (i64, [i64, c_p, c_p, i64, c_p, c_p, c_p, c_p]),
        "rwn_new": (c_p, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]),
        "rwn_free": (None, [c_p]),
        "rwn_node_count": (ctypes.c_int, [c_p]),
        "rwn_read": (ctypes.c_int, [c_p, c_p, c_p, i64]),
        "rwn_node": (i64, [c_p, ctypes.c_int, ctypes.POINTER(c_p), ctypes.POINTER(c_p),
                           ctypes.POINTER(c_p), ctypes.POINTER(c_p), ctypes.POINTER(i64)]),
    }  # fmt: skip
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load_library() -> ctypes.CDLL | None:
    """The native reader library, or None when this installation has none."""
    return nativelib.load(LIB_FILENAME, _bind)


def available() -> bool:
    """Whether this installation has the native reader library."""
    return load_library() is not None


# --------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Column:
    """One output column: the field group.name, its type code and slot."""

    group: str
    name: str
    code: str  # i, n, f, b, s (see rwparse.h)
    slot: int


@dataclass(frozen=True, eq=False)  # hashed by identity: cached per layout
class Layout:
    """What the native reader extracts, and the Arrow struct types it yields."""

    spec: bytes
    group_slots: dict[str, int]
    columns: tuple[Column, ...]
    slot_codes: tuple[str, ...]

    @property
    def slots(self) -> int:
        return len(self.slot_codes)


_FIELD_REF = re.compile(r"\b(header|metadata|coll_perf|p2p_perf|rankwatch)\.(\w+)")


def lean_projection_fields() -> dict[tuple[str, str], bool]:
    """Fields the lean projection of tables.OP_COLUMNS reads: (group, name) ->
    whether it feeds an INTEGER column (so must fit 32 bits)."""
    used: dict[tuple[str, str], bool] = {}
    for _, sql_type, expr, lean_expr in OP_COLUMNS:
        for group, name in _FIELD_REF.findall(lean_expr or expr):
            used[(group, name)] = used.get((group, name), False) or sql_type == "INTEGER"
    return used


def build_layout() -> Layout:
    """The spec for rwp_new: every declared field of every op-record group is
    type-checked; the ones the lean projection reads get an output slot."""
    used = lean_projection_fields()
    lines: list[str] = []
    group_slots: dict[str, int] = {}
    columns: list[Column] = []
    codes: list[str] = []
    for group in OP_GROUP_FIELDS:
        group_slots[group] = len(codes)
        codes.append("g")
        lines.append(f"group {group} {group_slots[group]}")
    for key in op_json_columns():
        if key not in OP_GROUP_FIELDS:
            lines.append(f"reject {key}")
    for group, fields in OP_GROUP_FIELDS.items():
        for name, sql_type in fields:
            code = SQL_TO_CODE[sql_type]
            narrow = used.get((group, name))
            if narrow and code == "i":
                code = "n"
            slot = -1
            if narrow is not None:
                slot = len(codes)
                codes.append(code)
                columns.append(Column(group, name, code, slot))
            lines.append(f"field {group} {name} {code} {slot}")
    missing = set(used) - {(c.group, c.name) for c in columns}
    if missing:
        raise RuntimeError(f"lean projection reads undeclared fields: {sorted(missing)}")
    return Layout(("\n".join(lines) + "\n").encode(), group_slots, tuple(columns), tuple(codes))


def column_for(shape: Layout, ops_column: str) -> Column:
    """The output column the ops table's `ops_column` is read from: the one record
    field its lean projection names (KeyError/RuntimeError when it names none or
    several)."""
    lean = {name: (lean_expr or expr) for name, _, expr, lean_expr in OP_COLUMNS}
    refs = set(_FIELD_REF.findall(lean[ops_column]))
    if len(refs) != 1:
        raise RuntimeError(f"ops.{ops_column}: expected one field in {lean[ops_column]!r}")
    group, name = refs.pop()
    for c in shape.columns:
        if (c.group, c.name) == (group, name):
            return c
    raise KeyError(f"{group}.{name}")


class Keeper(Protocol):
    """Keeps what it needs of each chunk the reader parses (store.captured,
    store.grouped, store.p2p_rows), and forgets a file's when told."""

    def add(self, path: str, chunk: Chunk, strings: list[str], keys: list[str | None]) -> None:
        """A parsed chunk of `path`: its string dictionary so far, and the comm_key
        of each string."""

    def drop(self, path: str) -> None:
        """Forget what was kept of `path` (the file goes through the DuckDB path)."""


def capture_slots(shape: Layout) -> dict[str, int]:
    """The slot of each ops column a CollectiveCapture reads."""
    return {name: column_for(shape, name).slot for name in captured.CAPTURE_COLUMNS}


def group_slots(shape: Layout) -> dict[str, int]:
    """The slot of each ops column a GroupCapture reads."""
    return {name: column_for(shape, name).slot for name in grouped.GROUP_COLUMNS}


def p2p_slots(shape: Layout) -> dict[str, int]:
    """The slot of each ops column a P2PCapture reads."""
    names = ("kind", *(name for name, _ in p2p_rows.COLUMNS))
    return {name: column_for(shape, name).slot for name in names}


# --------------------------------------------------------------------- chunks


@dataclass
class Chunk:
    """Buffers of one chunk, as the library fills them. `take`, where set, gives the
    zeroed memory to_arrow's narrower copies go to (an op reader's Slabs)."""

    rows: int
    values: list[np.ndarray | None]
    valid: list[np.ndarray]
    take: Callable[[int], np.ndarray] | None = None

    def pointers(self) -> tuple[Any, Any]:
        """The addresses of the value and validity buffers, slot by slot, as rwp_bind
        takes them (NULL for a slot without values)."""
        slots = ctypes.c_void_p * len(self.valid)
        values = slots(*[(v.ctypes.data if v is not None else None) for v in self.values])
        return values, slots(*[v.ctypes.data for v in self.valid])


def _zeroed(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


def _unset(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def _new_chunk(
    layout: Layout,
    rows: int,
    scratch: Callable[[int, int], np.ndarray] | None = None,
    slabs: Slabs | None = None,
) -> Chunk:
    """Buffers for `rows` rows: from `slabs` where given (zeroed; the chunk's
    narrower copies go there too), else fresh (zeroed: bitmaps and string codes);
    but the columns to_arrow copies into narrower ones (NARROW) from `scratch`
    (slot, nbytes -> uint8) where given: memory used again for each chunk, as
    nothing keeps those buffers."""
    take = slabs.take if slabs is not None else _zeroed
    unset = slabs.take if slabs is not None else _unset
    values: list[np.ndarray | None] = []
    for slot, code in enumerate(layout.slot_codes):
        if code in NARROW and scratch is not None:
            width = 8 if code == "n" else 4
            buf = scratch(slot, rows * width).view(np.int64 if code == "n" else np.int32)
            if code == "s":
                buf[:] = 0  # see below
            values.append(buf)
        elif code in "in":
            values.append(unset(rows * 8).view(np.int64))
        elif code == "f":
            values.append(unset(rows * 8).view(np.float64))
        elif code in "sr":
            # a NULL string keeps its code slot as allocated: zeroed, it is a valid
            # index; Arrow reads even those slots when it combines or unifies
            # dictionaries (the joined batches below, store.held), and crashed on
            # an index out of range
            values.append(take(rows * 4).view(np.int32))
        elif code == "b":
            values.append(take((rows + 7) // 8))
        else:
            values.append(None)
    valid = [take((rows + 7) // 8) for _ in layout.slot_codes]
    return Chunk(0, values, valid, None if slabs is None else slabs.take)


def all_set(bits: np.ndarray, rows: int) -> bool:
    """Whether the first `rows` bits of an LSB-first bitmap are all set."""
    full, rest = divmod(rows, 8)
    if full and not bool(np.all(bits[:full] == 0xFF)):
        return False
    return not rest or (int(bits[full]) & ((1 << rest) - 1)) == (1 << rest) - 1


def unpack(bits: np.ndarray, rows: int) -> np.ndarray:
    return np.unpackbits(bits, bitorder="little", count=rows).astype(bool)


@dataclass
class FileOutcome:
    """How the native reader did on one file."""

    rows: int = 0
    lines: int = 0
    flagged: list[tuple[int, str]] = field(default_factory=list)  # (line, reason), first few
    flagged_total: int = 0
    unterminated: int = 0  # line number of a last line without newline, 0 if none
    reject: str = ""  # why the file must go through the DuckDB path; "" when it need not

    @property
    def truncated_candidate(self) -> bool:
        """The only flagged line is a last line without newline (maybe truncated)."""
        return (
            not self.reject
            and self.flagged_total == 1
            and self.unterminated > 0
            and self.flagged[0][0] == self.unterminated
        )

    @property
    def clean(self) -> bool:
        return not self.reject and self.flagged_total == 0


def new_handle(constructor: str, spec: bytes, what: str) -> tuple[ctypes.CDLL, ctypes.c_void_p]:
    """(the library, the object its `constructor` (rwp_new, rwn_new) made of spec);
    RuntimeError naming `what` when the library is missing or rejects the spec."""
    lib = load_library()
    if lib is None:
        raise RuntimeError("the native reader library is not installed")
    err = ctypes.create_string_buffer(256)
    handle = getattr(lib, constructor)(spec, err, len(err))
    if not handle:
        raise RuntimeError(f"{what}: {err.value.decode(errors='replace')}")
    return lib, ctypes.c_void_p(handle)


class Parser:
    """One native parser (one per thread) and the chunk it fills."""

    def __init__(self, layout: Layout, chunk_rows: int = CHUNK_ROWS) -> None:
        self._lib, self._p = new_handle("rwp_new", layout.spec, "native reader")
        self.layout = layout
        self.chunk_rows = chunk_rows
        self._capacity = chunk_rows  # rows the bound chunk holds

    def close(self) -> None:
        if self._p:
            self._lib.rwp_free(self._p)
            self._p = ctypes.c_void_p()

    def __enter__(self) -> Parser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ strings

    @property
    def handle(self) -> ctypes.c_void_p:
        """The library's parser (for rwn_read)."""
        return self._p

    def dictionary(self) -> Any:
        """The string dictionary so far (since the last reset), as an Arrow string array."""
        import pyarrow as pa

        count = int(self._lib.rwp_string_count(self._p))
        offsets = np.empty(count + 1, dtype=np.int32)
        length = ctypes.c_int64()
        addr = self._lib.rwp_strings(self._p, offsets.ctypes.data, ctypes.byref(length))
        data = ctypes.string_at(addr, length.value) if length.value else b""
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.string(), count, buffers)

    def string(self, code: int) -> str:
        """String `code` of the dictionary."""
        length = ctypes.c_int64()
        addr = self._lib.rwp_string(self._p, code, ctypes.byref(length))
        return ctypes.string_at(addr, length.value).decode("utf-8") if addr else ""

    def strings(self) -> list[str]:
        """This file's string dictionary so far, by code."""
        n = self._lib.rwp_string_count(self._p)
        out = []
        length = ctypes.c_int64()
        for code in range(n):
            addr = self._lib.rwp_string(self._p, code, ctypes.byref(length))
            out.append(ctypes.string_at(addr, length.value).decode("utf-8"))
        return out

    # -------------------------------------------------------------- chunks

    def reset(self) -> None:
        """Start a new file (and string dictionary)."""
        self._lib.rwp_reset(self._p)

    def next_file(self) -> None:
        """Start another file whose rows go on in the bound chunk (rwp_next_file)."""
        self._lib.rwp_next_file(self._p)

    def parse(self, addr: int, length: int) -> int:
        """Parse a whole buffer into the bound chunk; the bytes used (fewer when the
        chunk is full)."""
        return int(self._lib.rwp_parse(self._p, addr, length, 1))

    @property
    def capacity(self) -> int:
        """Rows the bound chunk holds."""
        return self._capacity

    def rows(self) -> int:
        """Rows in the bound chunk."""
        return int(self._lib.rwp_rows(self._p))

    def _new_chunk(self, rows: int) -> Chunk:
        return _new_chunk(self.layout, rows)

    def bind_chunk(self, rows: int) -> Chunk:
        """New buffers for `rows` rows, bound: the next rows parsed go there."""
        chunk = self._new_chunk(rows)
        if self._lib.rwp_bind(self._p, rows, *chunk.pointers()) != 0:
            raise RuntimeError("native reader: rwp_bind failed")
        self._capacity = rows
        return chunk

    def note_flags(self, outcome: FileOutcome) -> None:
        """The current file's lines and flagged lines so far, into `outcome`."""
        lib, p = self._lib, self._p
        outcome.lines = int(lib.rwp_lines(p))
        outcome.flagged_total = int(lib.rwp_flagged(p))
        outcome.unterminated = int(lib.rwp_unterminated_line(p))
        line, code = ctypes.c_int64(), ctypes.c_int()
        outcome.flagged = []
        for i in range(min(outcome.flagged_total, MAX_FLAGS)):
            lib.rwp_flag(p, i, ctypes.byref(line), ctypes.byref(code))
            outcome.flagged.append((line.value, FLAG_NAMES.get(code.value, str(code.value))))


class Reader(Parser):
    """A Parser reading whole op-record files chunk by chunk."""

    def __init__(self, layout: Layout, chunk_rows: int = CHUNK_ROWS) -> None:
        super().__init__(layout, chunk_rows)
        self._seen_bytes = self._seen_rows = 0  # of the plain files read (record size)
        self._kind = column_for(layout, "kind")
        self._checks = self._key_checks()
        self._slabs = Slabs()
        self._scratch: dict[int, np.ndarray] = {}
        # whether the batches made now are to be held (store.held): only those are
        # cut from slabs; a batch that is appended or spilled soon frees its memory,
        # which the heap then gives to the next chunk (a slab freed would be unmapped,
        # and the next one faulted in again: at 3 M records, where half the batches
        # spill, that cost more than the huge pages saved)
        self.holding: Callable[[], bool] = lambda: False

    def _new_chunk(self, rows: int) -> Chunk:
        """Buffers the batches keep: from this reader's slabs while they are held;
        the ones to_arrow narrows from its scratch, used again by the next chunk
        (bound only once the batch of this one is made: see _file_batches,
        _unit_batch)."""
        slabs = self._slabs if self.holding() else None
        return _new_chunk(self.layout, rows, self._scratch_for, slabs)

    def _scratch_for(self, slot: int, nbytes: int) -> np.ndarray:
        have = self._scratch.get(slot)
        if have is None or len(have) < nbytes:
            have = self._scratch[slot] = np.empty(max(nbytes, 1), dtype=np.uint8)
        return have[:nbytes]

    def __enter__(self) -> Reader:
        return self

    def _key_checks(self) -> tuple[Column, ...]:
        """Columns the DuckDB path requires non-null for a clean op (OP_KEY_COLUMNS
        as the lean projection computes them: host, pid, comm_id, rank, func)."""
        from rankwatch.store.tables import OP_KEY_COLUMNS

        return tuple(column_for(self.layout, key) for key in OP_KEY_COLUMNS)

    # ------------------------------------------------------------- checks

    def _problem(self, chunk: Chunk, strings: list[str]) -> str:
        """Why rows of this chunk would not be clean ops for the DuckDB path, or ""."""
        rows = chunk.rows
        group = self.layout.group_slots["rankwatch"]
        if not all_set(chunk.valid[group], rows):
            return "record without a rankwatch object (Inspector record)"
        for c in self._checks:
            if not all_set(chunk.valid[c.slot], rows):
                return f"{c.group}.{c.name} missing"
        kind = self._kind
        if not all_set(chunk.valid[kind.slot], rows):
            return "rankwatch.kind missing"
        codes = chunk.values[kind.slot]
        assert codes is not None
        is_op = np.array([s in ("coll", "p2p") for s in strings], dtype=bool)
        if not bool(is_op[codes[:rows]].all()):
            return "rankwatch.kind not coll or p2p"
        if not all_set(chunk.valid[column_for(self.layout, "seq").slot], rows):
            # a P2P op without one is numbered per pair by ingest, in the table
            # (ingest.derive_inspector_fields); a collective without one is broken
            return "op without seq"
        version = column_for(self.layout, "schema_version")
        values = chunk.values[version.slot]
        assert values is not None
        present = values[:rows]
        if not all_set(chunk.valid[version.slot], rows):
            present = present[unpack(chunk.valid[version.slot], rows)]
        if present.size and int(present.max()) > schema.SCHEMA_VERSION:
            return "newer schema"
        return ""

    # -------------------------------------------------------------- files

    def _first_rows(self, rf: RecordFile) -> int:
        """Rows of a file's first chunk: for a plain file once this reader has seen
        records, _rows_for its size; else its size over a small record's (a dozen
        times that in a gzip file), so that a small file (a thousand ranks' files of a
        few hundred records) does not get buffers for CHUNK_ROWS rows; a file with
        more records goes on with full chunks."""
        if not rf.compressed and self._seen_rows:
            return self._rows_for(rf.size)
        guess = _text_bytes(rf) // SMALL_RECORD_BYTES + 1
        return int(min(self.chunk_rows, max(guess, MIN_FIRST_ROWS)))

    def _rows_for(self, left: int) -> int:
        """Rows of the next chunk of a plain file with `left` bytes to go: enough for
        them at the record size this reader has seen (a little over, so that one
        chunk takes them), at most a full chunk. The batches then fit their rows
        without a copy (see to_arrow)."""
        if not self._seen_rows:
            return self.chunk_rows
        guess = int(left * 1.02 * self._seen_rows / self._seen_bytes) + MIN_FIRST_ROWS
        return min(self.chunk_rows, guess)

    def _full(self) -> bool:
        return int(self._lib.rwp_rows(self._p)) >= self._capacity

    def _finish_chunk(self, chunk: Chunk) -> tuple[Chunk, list[str]]:
        chunk.rows = int(self._lib.rwp_rows(self._p))
        return chunk, self.strings()

    def read(self, rf: RecordFile, outcome: FileOutcome) -> Iterator[tuple[Chunk, list[str]]]:
        """Chunks of rf's records; fills `outcome` as it goes, and stops early once
        the file is known to need the DuckDB path (outcome.reject)."""
        self._lib.rwp_reset(self._p)
        for chunk, strings in self._chunks(rf):
            self.note_flags(outcome)
            # a flagged line is acceptable only as the file's unterminated last line,
            # which is known once the last chunk is parsed
            if outcome.flagged_total and not outcome.truncated_candidate:
                outcome.reject = "flagged line(s): " + ", ".join(
                    f"{line} ({why})" for line, why in outcome.flagged[:3]
                )
                return
            if chunk.rows:
                outcome.rows += chunk.rows
                problem = self._problem(chunk, strings)
                if problem:
                    outcome.reject = problem
                    return
                yield chunk, strings

    def read_unit(
        self, files: Sequence[RecordFile], outcomes: dict[str, FileOutcome]
    ) -> tuple[Chunk, list[str], list[int]] | None:
        """Small files (a unit of units()) parsed into one chunk, their rows one
        file after another with one string dictionary: (the chunk, its strings, each
        file's row count), their outcomes filled; None when a file cannot be read or
        is not clean, or a row would not be a clean op (_problem), with nothing filled:
        the caller reads each file alone then, which says what is wrong."""
        with contextlib.ExitStack() as stack:
            texts: list[_Mapped | _Decompressed] = []
            for rf in files:
                try:
                    texts.append(
                        _Decompressed(rf.path)
                        if rf.compressed
                        else stack.enter_context(_Mapped(rf.path, UNIT_READ_BYTES))
                    )
                except (OSError, EOFError, ValueError, zlib.error):  # e.g. a cut gzip stream
                    return None
            parsed = self._parse_unit(texts, self._unit_rows(texts))
            if parsed == "full":  # more rows than the record size seen so far gave room for
                parsed = self._parse_unit(texts, self._unit_rows(texts, exact=True))
            size = sum(text.size for text in texts)
        if not isinstance(parsed, tuple):
            return None
        chunk, strings, found = parsed
        outcomes.update(zip((rf.path for rf in files), found, strict=True))
        self._seen_bytes += size
        self._seen_rows += sum(outcome.lines for outcome in found)
        return chunk, strings, [outcome.rows for outcome in found]

    def _unit_rows(self, texts: Sequence[_Mapped | _Decompressed], exact: bool = False) -> int:
        """Rows to make room for in a unit's chunk: from the record size this reader
        has seen (a tenth over: within FIT_SLACK, so that to_arrow need not copy the
        columns to fit), or exactly a row per line (and one for a last line without
        newline), which takes a pass over the bytes."""
        size = sum(text.size for text in texts)
        if self._seen_rows and not exact:
            return int(size * 1.1 * self._seen_rows / self._seen_bytes) + MIN_FIRST_ROWS
        return sum(text.newlines() + 1 for text in texts)

    def _parse_unit(
        self, texts: Sequence[_Mapped | _Decompressed], capacity: int
    ) -> tuple[Chunk, list[str], list[FileOutcome]] | str | None:
        """The texts parsed into one chunk of `capacity` rows, file after file:
        (the chunk, its strings, each file's outcome); "full" when the chunk has no
        room for them all; None when a file or row is not clean (see read_unit)."""
        lib, p = self._lib, self._p
        lib.rwp_reset(p)
        chunk = self.bind_chunk(capacity)
        found = []
        for text in texts:
            lib.rwp_next_file(p)
            start = int(lib.rwp_rows(p))
            used = int(lib.rwp_parse(p, text.addr, text.size, 1)) if text.size else 0
            if used < text.size:  # the chunk is full: parsing stops at a line's start
                return "full"
            if lib.rwp_flagged(p):
                return None
            found.append(FileOutcome())
            self.note_flags(found[-1])
            found[-1].rows = int(lib.rwp_rows(p)) - start
        chunk, strings = self._finish_chunk(chunk)
        if chunk.rows and self._problem(chunk, strings):
            return None
        return chunk, strings, found

    def _chunks(self, rf: RecordFile) -> Iterator[tuple[Chunk, list[str]]]:
        """Full chunks of rf's records, then the last one (maybe empty)."""
        chunk = self.bind_chunk(self._first_rows(rf))
        if rf.compressed:
            for addr, length, final, keep in _gzip_blocks(rf.path):
                pos = 0
                while True:
                    pos += int(self._lib.rwp_parse(self._p, addr + pos, length - pos, final))
                    if not self._full():
                        break  # all complete lines of the block are parsed
                    yield self._finish_chunk(chunk)
                    chunk = self.bind_chunk(self.chunk_rows)
                keep.append(pos)
        else:
            with _Mapped(rf.path) as mapped:
                pos = 0
                while pos < mapped.size:
                    left = mapped.size - pos
                    pos += int(self._lib.rwp_parse(self._p, mapped.addr + pos, left, 1))
                    mapped.release(pos)
                    if not self._full():
                        break
                    yield self._finish_chunk(chunk)
                    chunk = self.bind_chunk(self._rows_for(mapped.size - pos))
                self._seen_bytes += pos
                self._seen_rows += int(self._lib.rwp_lines(self._p))
        yield self._finish_chunk(chunk)


def _gzip_blocks(path: str) -> Iterator[tuple[int, int, int, list[int]]]:
    """(address, length, final, used) of decompressed blocks; the caller appends
    to `used` how many bytes it parsed, and the rest (a partial line) is carried
    into the next block."""
    with gzip.open(path, "rb") as stream:
        pending = b""
        final = False
        while not final:
            block = stream.read(GZIP_BLOCK)
            final = not block
            buf = pending + block if pending else block
            view = np.frombuffer(buf, dtype=np.uint8)
            used: list[int] = []
            yield (view.ctypes.data if len(buf) else 0), len(buf), int(final), used
            pending = buf[used[0] if used else 0 :]
            del view


def count_newlines(buf: np.ndarray) -> int:
    """How many newline bytes a uint8 buffer holds (a few times faster than
    bytes.count, which tests one byte at a time)."""
    return int(np.count_nonzero(buf == ord("\n")))


class _Mapped:
    """A plain file mapped read-only; pages already parsed are dropped from this
    process's resident set as parsing moves on (the page cache keeps them). A small
    file is read whole instead: one copy costs less than mapping it, faulting its
    pages in and unmapping it (a thousand ranks' files of a few hundred KB)."""

    def __init__(self, path: str, read_up_to: int = READ_WHOLE_BYTES) -> None:
        self._read_up_to = read_up_to  # a file up to this size is read whole
        self._file = open(path, "rb")  # noqa: SIM115 - closed in __exit__
        self.size = os.fstat(self._file.fileno()).st_size
        self._map: mmap.mmap | None = None
        self._view: np.ndarray | None = None
        self.addr = 0
        self._dropped = 0

    def __enter__(self) -> _Mapped:
        if 0 < self.size <= self._read_up_to:
            data = self._file.read()
            self.size = len(data)  # a file still being written may have grown
            self._view = np.frombuffer(data, dtype=np.uint8)
            self.addr = self._view.ctypes.data if self.size else 0
        elif self.size:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_SEQUENTIAL"):
                self._map.madvise(mmap.MADV_SEQUENTIAL)
            self._view = np.frombuffer(self._map, dtype=np.uint8)
            self.addr = self._view.ctypes.data
        return self

    def release(self, pos: int) -> None:
        done = pos - pos % mmap.PAGESIZE
        if self._map is not None and done > self._dropped and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, self._dropped, done - self._dropped)
            self._dropped = done

    def newlines(self) -> int:
        """How many newlines the file has."""
        return 0 if self._view is None else count_newlines(self._view)

    def __exit__(self, *exc: object) -> None:
        self._view = None
        if self._map is not None:
            self._map.close()
        self._file.close()


class _Decompressed:
    """A gzip file decompressed whole (a small one, read in a unit): `addr` and
    `size` of its bytes, as _Mapped has them."""

    def __init__(self, path: str) -> None:
        with gzip.open(path, "rb") as stream:
            self._data = stream.read()
        self.size = len(self._data)
        self.addr = np.frombuffer(self._data, dtype=np.uint8).ctypes.data if self.size else 0

    def newlines(self) -> int:
        return count_newlines(np.frombuffer(self._data, dtype=np.uint8))


# ---------------------------------------------------------------------- arrow

_COMM_KEY_SQL = next(expr for name, _, expr, _ in OP_COLUMNS if name == "comm_key")
_local = threading.local()


def comm_keys(ids: list[str]) -> list[str | None]:
    """ops.comm_key of each communicator id, exactly as tables.OP_COLUMNS computes
    it: directly for ASCII ids (all real ones), through DuckDB for any other."""
    out: list[str | None] = []
    odd: list[int] = []
    for i, text in enumerate(ids):
        if text.isascii():
            out.append("0x" + text[2:].lower().lstrip("0")[:14])
        else:
            out.append(None)
            odd.append(i)
    if odd:
        import duckdb

        con = getattr(_local, "con", None)
        if con is None:
            con = _local.con = duckdb.connect()
        expr = _COMM_KEY_SQL.replace("header.id", "x")
        rows = con.execute(
            f"SELECT i, {expr} FROM (SELECT unnest(?::VARCHAR[]) AS x, unnest(?::BIGINT[]) AS i)",
            [[ids[i] for i in odd], odd],
        ).fetchall()
        for i, key in rows:
            out[i] = key
    return out


_LAYOUT: Layout | None = None


def layout() -> Layout:
    global _LAYOUT
    if _LAYOUT is None:
        _LAYOUT = build_layout()
    return _LAYOUT


def flat_name(group: str, name: str) -> str:
    """The column of a chunk that holds the record field `group.name`."""
    return f"{group}.{name}"


@functools.lru_cache(maxsize=4)
def arrow_schema(layout: Layout) -> Any:
    """The schema of every chunk: the file's path and the communicator's comm_key,
    one BOOLEAN column per group (NULL where the record has no such object, else
    true), then each field as its own column, named by flat_name(). Narrower than
    the parser's buffers, as the batches are held or spilled (store.held): 32-bit
    integers where the field is range-checked to 32 bits ('n'), strings as 16-bit
    codes (a file's dictionary has a few dozen; to_arrow refuses more than fit, and
    _Coalescer joins no more files than their dictionaries' codes fit)."""
    import pyarrow as pa

    text = pa.dictionary(pa.int16(), pa.string())
    arrow = {"i": pa.int64(), "n": pa.int32(), "f": pa.float64(), "b": pa.bool_(), "s": text}
    columns = [pa.field("source_file", text), pa.field("comm_key", text)]
    columns += [pa.field(g, pa.bool_()) for g in layout.group_slots]
    columns += [pa.field(flat_name(c.group, c.name), arrow[c.code]) for c in layout.columns]
    return pa.schema(columns)


_ARROW_TYPES: dict[str, Any] = {}
# to_arrow's narrower copies of the parser's columns (see arrow_schema)
NARROW = {"n": np.int32, "s": np.int16}
MAX_CODES = np.iinfo(np.int16).max


def _narrowed(
    values: np.ndarray, dtype: Any, take: Callable[[int], np.ndarray] | None
) -> np.ndarray:
    """values cast to dtype (as astype casts: the parser's values fit), in memory
    from `take` where given."""
    if take is None:
        return values.astype(dtype)
    out = take(len(values) * np.dtype(dtype).itemsize).view(dtype)
    np.copyto(out, values, casting="unsafe")
    return out


def column_array(code: str, rows: int, values: np.ndarray, valid: Any, dictionary: Any) -> Any:
    """An Arrow array over a column's buffers as the library filled them: numbers
    and bools as they are, strings ('s', 'r') as int32 codes into `dictionary`."""
    import pyarrow as pa

    if not _ARROW_TYPES:
        _ARROW_TYPES.update(i=pa.int64(), n=pa.int64(), f=pa.float64(), b=pa.bool_())
    if code in "sr":
        codes = pa.Array.from_buffers(pa.int32(), rows, [valid, pa.py_buffer(values)])
        return pa.DictionaryArray.from_arrays(codes, dictionary, safe=False)
    return pa.Array.from_buffers(_ARROW_TYPES[code], rows, [valid, pa.py_buffer(values)])


def to_arrow(
    layout: Layout,
    chunk: Chunk,
    strings: list[str],
    path: str,
    keys: list[str | None],
    files: Sequence[tuple[str, int]] = (),
) -> Any:
    """The chunk as an Arrow record batch of arrow_schema(): `source_file` (`path`,
    or for a unit of files (Reader.read_unit) `files`: each path and its row count,
    in row order),
    `comm_key` (`keys`: the comm_key of each string, see comm_keys()), the groups,
    then the fields, NULL where their group is (as a field of a missing JSON
    object reads in SQL). Flat rather than one struct per group, so that a scan
    converts only the fields it reads; lean_projection() maps it to `ops`."""
    import pyarrow as pa

    rows = chunk.rows
    nbits = (rows + 7) // 8
    if len(chunk.valid[0]) > FIT_SLACK * nbits:
        # Buffers sized for a full chunk that a file's first or last chunk seldom
        # fills: copied to fit, as the batch may be held (store.held) long after.
        chunk = Chunk(
            rows,
            [v if v is None else v[: nbits if v.dtype == np.uint8 else rows].copy()
             for v in chunk.values],
            [v[:nbits].copy() for v in chunk.valid],
        )  # fmt: skip
    if len(strings) > MAX_CODES:
        raise ValueError(f"{path}: more than {MAX_CODES} distinct strings")
    dictionary = pa.array(strings, type=pa.string())
    present = {g: chunk.valid[slot] for g, slot in layout.group_slots.items()}
    partial = {g for g, bits in present.items() if not all_set(bits, rows)}
    true = pa.py_buffer(np.full(nbits, 0xFF, dtype=np.uint8))
    groups = [
        pa.Array.from_buffers(pa.bool_(), rows, [pa.py_buffer(bits), true])
        for bits in present.values()
    ]
    fields, comm_key = [], None
    for c in layout.columns:
        bits = chunk.valid[c.slot]
        if c.group in partial:
            bits = np.bitwise_and(bits, present[c.group])
        valid = pa.py_buffer(bits)
        values = chunk.values[c.slot]
        assert values is not None
        if c.code in NARROW:
            values = _narrowed(values[:rows], NARROW[c.code], chunk.take)
            type_ = pa.from_numpy_dtype(values.dtype)
            array = pa.Array.from_buffers(type_, rows, [valid, pa.py_buffer(values)])
            if c.code == "s":
                array = pa.DictionaryArray.from_arrays(array, dictionary, safe=False)
        else:
            array = column_array(c.code, rows, values, valid, dictionary)
        if (c.group, c.name) == ("header", "id"):
            comm_key = pa.DictionaryArray.from_arrays(
                array.indices, pa.array(keys, type=pa.string()), safe=False
            )
        fields.append(array)
    if files:
        codes = np.repeat(np.arange(len(files), dtype=np.int16), [n for _, n in files])
        paths = [p for p, _ in files]
    else:
        codes, paths = np.zeros(rows, dtype=np.int16), [path]
    source = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(paths, type=pa.string()))
    assert comm_key is not None
    return pa.RecordBatch.from_arrays(
        [source, comm_key, *groups, *fields], schema=arrow_schema(layout)
    )


# ------------------------------------------------------------------ loading

JOIN_BELOW_ROWS = 1 << 11  # batches of files this small (a thousand ranks' files) ...
COALESCE_ROWS = 1 << 14  # ... are joined into batches of about this many rows
COALESCE_BYTES = 1 << 26  # ... or fewer, when their buffers (sized from bytes) take this


class _Coalescer:
    """Joins the batches of files read in one chunk into batches of about
    COALESCE_ROWS rows before they go to DuckDB (their string dictionaries unified),
    fewer batches for DuckDB's scan of an Arrow stream at a thousand ranks' files of
    a few hundred records each. (The chunks of larger files go as they are: holding
    one would hold buffers sized for CHUNK_ROWS rows.)"""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        self.emit = emit
        self.held: list[Any] = []
        self.rows = self.bytes = self.codes = 0

    def add(self, batch: Any) -> None:
        if batch.num_rows >= JOIN_BELOW_ROWS:  # large enough as it is: no copy
            self.emit(batch)
            return
        # the joined batch's dictionaries are the union of the files': they must
        # stay within the 16-bit codes (arrow_schema), or joining them fails
        codes = max(len(column.dictionary) for column in batch.columns[:2])
        if self.held and self.codes + codes > MAX_CODES:
            self.flush()
        self.held.append(batch)
        self.rows += batch.num_rows
        self.bytes += batch.get_total_buffer_size()
        self.codes += codes
        if self.rows >= COALESCE_ROWS or self.bytes >= COALESCE_BYTES:
            self.flush()

    def flush(self) -> None:
        if len(self.held) == 1:
            self.emit(self.held[0])
        elif self.held:
            import pyarrow as pa

            table = pa.Table.from_batches(self.held).combine_chunks()
            for batch in table.to_batches():
                self.emit(batch)
        self.held, self.rows, self.bytes, self.codes = [], 0, 0, 0


def _text_bytes(rf: RecordFile) -> int:
    """The file's bytes of records: its size, or a guess for a gzip file."""
    return rf.size * (GZIP_RATIO if rf.compressed else 1)


def units(files: Sequence[RecordFile]) -> list[list[RecordFile]]:
    """The files cut into units of work for load_files: small files (up to
    READ_WHOLE_BYTES of records, gzip ones by a guess) in runs of up to UNIT_BYTES
    and UNIT_FILES, read as one (Reader.read_unit: at a thousand ranks' files the
    work per file, not per record, took most of the time), by path; every other
    file alone, before them. Made from the sizes alone, so that the same files always
    make the same units (the rows kept of them come in the same order)."""
    # larger files first: the parsing threads end about together on the small units
    out = [[f] for f in files if _text_bytes(f) > READ_WHOLE_BYTES]
    size = UNIT_BYTES + 1  # the first small file starts a unit
    small = sorted((f for f in files if _text_bytes(f) <= READ_WHOLE_BYTES), key=lambda f: f.path)
    for f in small:
        if size + _text_bytes(f) > UNIT_BYTES or len(out[-1]) >= UNIT_FILES:
            out.append([])
            size = 0
        out[-1].append(f)
        size += _text_bytes(f)
    return out


def _unit_batch(
    reader: Reader,
    shape: Layout,
    unit: Sequence[RecordFile],
    outcomes: dict[str, FileOutcome],
    keepers: Sequence[Keeper] = (),
) -> Any:
    """A unit of small files (units()) as one Arrow batch, handed to the keepers
    under its first file's path; None when Reader.read_unit declines it, or when
    a keeper or to_arrow refuses it (what the keepers took of it is dropped)."""
    got = reader.read_unit(unit, outcomes)
    if got is None:
        return None
    chunk, strings, counts = got
    key = unit[0].path
    try:
        keys = comm_keys(strings)
        for keeper in keepers:
            keeper.add(key, chunk, strings, keys)
        files = [(f.path, n) for f, n in zip(unit, counts, strict=True)]
        return to_arrow(shape, chunk, strings, key, keys, files)
    except (ValueError, RuntimeError):  # each file alone then, which says why
        for keeper in keepers:
            keeper.drop(key)
        for f in unit:
            outcomes[f.path] = FileOutcome()
        return None


def _file_batches(
    reader: Reader,
    shape: Layout,
    rf: RecordFile,
    outcome: FileOutcome,
    keepers: Sequence[Keeper] = (),
) -> Iterator[Any]:
    """rf's records as Arrow batches (Reader.read's chunks, see to_arrow), each
    chunk also handed to the keepers."""
    keys: list[str | None] = []
    for chunk, strings in reader.read(rf, outcome):
        keys += comm_keys(strings[len(keys) :])
        for keeper in keepers:
            keeper.add(rf.path, chunk, strings, keys)
        yield to_arrow(shape, chunk, strings, rf.path, keys)


def load_files(
    con: Any,
    files: list[RecordFile],
    workers: int,
    between: Callable[[], object] | None = None,
    round_rows: int = ROUND_ROWS,
    held: HeldOps | None = None,
    keepers: Sequence[Keeper] = (),
) -> dict[str, FileOutcome]:
    """Append the records of `files` to `ops`: `workers` threads parse, and INSERT
    statements stream their chunks into DuckDB, one per round of about
    `round_rows` rows (a statement appends several times faster than one per
    chunk), calling `between()` after each round (e.g. to compress the tables).
    `held` takes the chunks instead (store.held): it holds them as long as they
    fit its budget and writes the rest to Arrow IPC files, appending none. Returns
    each file's outcome; the rows of a file with outcome.reject are removed again
    (it needs the DuckDB path). The keepers keep what they need of every file's
    chunks as parsed (captured, grouped, p2p_rows); the caller drops it for the files
    it does not take."""
    import pyarrow as pa

    shape = layout()
    outcomes = {f.path: FileOutcome() for f in files}
    if not files:
        return outcomes
    pending = list(reversed(units(files)))
    lock = threading.Lock()
    items: queue.Queue[tuple[str, RecordFile | None, Any]] = queue.Queue(maxsize=workers + 1)
    stop = threading.Event()
    failures: list[BaseException] = []

    def put(item: tuple[str, RecordFile | None, Any]) -> None:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read_file(reader: Reader, rf: RecordFile, joined: _Coalescer) -> None:
        outcome = outcomes[rf.path]
        try:
            batches = _file_batches(reader, shape, rf, outcome, keepers)
            first, second = next(batches, None), next(batches, None)
            if second is None:  # read in one chunk: joined with other files'
                if first is not None and not outcome.reject:
                    joined.add(first)
            else:  # a larger file: its chunks go as they are
                for batch in itertools.chain((first, second), batches):
                    put(("chunk", rf, batch))
        except (OSError, ValueError, EOFError, RuntimeError) as exc:
            # e.g. a corrupt gzip stream: DuckDB's path and the careful
            # reader say what is wrong with the file
            outcome.reject = f"could not read: {exc}"

    def holding() -> bool:
        return held is not None and held.open

    def work() -> None:
        joined = _Coalescer(lambda batch: put(("chunk", None, batch)))
        try:
            with Reader(shape) as reader:
                reader.holding = holding
                while not stop.is_set():
                    with lock:
                        if not pending:
                            break
                        unit = pending.pop()
                    batch = None
                    if len(unit) > 1:
                        batch = _unit_batch(reader, shape, unit, outcomes, keepers)
                    if batch is not None:
                        joined.add(batch)
                        continue
                    for rf in unit:
                        read_file(reader, rf, joined)
            joined.flush()
        except BaseException as exc:  # handed to the inserting thread, raised there
            put(("error", None, exc))
        finally:
            put(("exit", None, None))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, workers))]
    running = len(threads)

    def batches() -> Iterator[Any]:
        """One round's batches: until round_rows rows or the last worker is done."""
        nonlocal running
        rows = 0
        while running and rows < round_rows:
            kind, _, payload = items.get()
            if kind == "exit":
                running -= 1
            elif kind == "error":
                failures.append(payload)
                stop.set()
                running = 0
            else:
                rows += payload.num_rows
                yield payload

    def appended() -> Iterator[Any]:
        """A round's batches that `held` does not hold (all of them once it is full)."""
        for batch in batches():
            if held is None or not held.take(batch):
                yield batch

    for t in threads:
        t.start()
    projection = lean_projection()
    try:
        while running:
            if held is not None:
                held.spill(con, appended())
                continue
            stream = pa.RecordBatchReader.from_batches(arrow_schema(shape), appended())
            con.register("rankwatch_native_chunks", stream)
            try:
                con.execute(f"INSERT INTO ops SELECT {projection} FROM rankwatch_native_chunks")
            finally:
                con.unregister("rankwatch_native_chunks")
            if between is not None and not failures:
                between()
    except Exception:
        if failures:
            raise failures[0] from None
        raise
    finally:
        stop.set()
        for t in threads:
            t.join()
    if failures:
        raise failures[0]
    drop_rows(con, held, [p for p, o in outcomes.items() if o.reject and o.rows])
    return outcomes


def drop_rows(con: Any, held: HeldOps | None, paths: list[str]) -> None:
    """Remove the op rows load_files took from these files: from `held` where it
    took them (none are in the table then), else from the table."""
    from rankwatch.store import load

    if held is not None:
        held.drop_files(con, paths)
    else:
        load.delete_files(con, "ops", paths)


def lean_projection() -> str:
    """The SELECT list from to_arrow's batches to the columns of `ops`: the lean
    projection of DuckDB's reader, its `group.field` references naming the flat
    columns instead. `kind` is the record's field as it is, not the lean CASE: the
    reader yields only chunks whose every row is coll or p2p (Reader._problem), and
    a filter on a plain column reaches the scan of the batches."""
    from rankwatch.store import load

    given = {"comm_key": "comm_key", "kind": "rankwatch.kind"}
    lean = load.op_projection("source_file", lean=True, given=given)
    return _FIELD_REF.sub(lambda m: '"' + flat_name(m[1], m[2]) + '"', lean)
