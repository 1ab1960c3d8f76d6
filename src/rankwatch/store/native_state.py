"""The native reader of state files (`<host>-pid<pid>.rwstate.jsonl`): the op
records' parser (native.Parser over librankwatch-rwparse) with a layout of
top-level fields. Scalar fields become typed columns; the nested ones (progress's
`colls`, `p2p` and `in_flight`) are kept as their JSON text, then each row's
text is read into an Arrow array of the type DuckDB's reader gives them
(load.stage_state) by the library's nested reader (rwn_read). INSERTs then fill
comms, progress, clock and stats with the projection load.distribute_state uses.

A file is taken whole or not at all: one with any line the DuckDB path would not
take as a usable record (a flagged line, a blank line, a missing key field, an
unknown kind, a newer schema) is left to that path, and from there to the careful
reader that reports each bad line; a nested value the nested reader does not take
as it is (another JSON type, a duplicate key) does the same, as json_transform has
its own way with those. Both paths give identical tables
(tests/analysis/test_native_reader.py). DuckDB's reader typed these records at
about 9 us per line, building the nested values most of it.
"""

from __future__ import annotations

import ctypes
import functools
import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from rankwatch import schema
from rankwatch.store import background, load, native
from rankwatch.store.discover import RecordFile
from rankwatch.store.tables import STATE_KIND_OF_TABLE, state_json_columns

TOP = "."  # rwparse's group of the line's own (top-level) fields
SOURCE = "rankwatch_state_records"  # the registered Arrow table the INSERTs read


@functools.cache
def layout() -> native.Layout:
    """Every state field at the top level, in state_json_columns()'s order: scalars
    typed, nested values ('r') as JSON text."""
    lines, columns, codes = [], [], []
    for name, sql_type in state_json_columns().items():
        code = native.SQL_TO_CODE.get(sql_type, "r")
        columns.append(native.Column(TOP, name, code, len(codes)))
        lines.append(f"field {TOP} {name} {code} {len(codes)}")
        codes.append(code)
    return native.Layout(("\n".join(lines) + "\n").encode(), {}, tuple(columns), tuple(codes))


@functools.cache
def nested_types() -> dict[str, Any]:
    """The Arrow type of each nested column, from its SQL type (arrow_type)."""
    types = state_json_columns()
    return {c.name: arrow_type(types[c.name]) for c in layout().columns if c.code == "r"}


_SQL_SCALARS = {"BIGINT": "int64", "INTEGER": "int32", "VARCHAR": "string"}


def arrow_type(sql: str) -> Any:
    """The Arrow type of a DuckDB type made of BIGINT, INTEGER, VARCHAR, STRUCT(...),
    MAP(K, V) and T[] (the nested state columns), as DuckDB exports it."""
    import pyarrow as pa

    sql = sql.strip()
    if sql.endswith("[]"):
        return pa.list_(pa.field("l", arrow_type(sql[:-2])))
    if sql in _SQL_SCALARS:
        return getattr(pa, _SQL_SCALARS[sql])()
    head, _, rest = sql.partition("(")
    if not rest.endswith(")") or head not in ("STRUCT", "MAP"):
        raise ValueError(f"no Arrow type for {sql!r}")
    parts = _split_top(rest[:-1])
    if head == "MAP":
        key, value = (arrow_type(p) for p in parts)
        return pa.map_(key, value)
    return pa.struct([(name, arrow_type(t)) for name, _, t in (p.partition(" ") for p in parts)])


def _split_top(text: str) -> list[str]:
    """`text` split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def nested_spec(arrow_type: Any) -> str:
    """rwn_new's spec of an Arrow type (rwparse.h: nodes in preorder)."""
    import pyarrow as pa

    t = arrow_type
    if t == pa.int64():
        return "i"
    if t == pa.int32():
        return "n"
    if t == pa.string():
        return "s"
    if pa.types.is_map(t):
        if t.key_type != pa.string():
            raise TypeError(f"map keys of {t}: only strings")
        return f"M {nested_spec(t.item_type)}"
    if pa.types.is_list(t):
        return f"L {nested_spec(t.value_type)}"
    if pa.types.is_struct(t):
        fields = " ".join(f"{f.name} {nested_spec(f.type)}" for f in t)
        return f"S {t.num_fields} {fields}"
    raise TypeError(f"no nested reading of {t}")


class NestedReader:
    """The JSON texts of one nested column (strings a parser interned) read into an
    Arrow array of its type; one per thread."""

    def __init__(self, arrow_type: Any) -> None:
        spec = nested_spec(arrow_type).encode()
        self._lib, self._n = native.new_handle("rwn_new", spec, "nested reader")
        self.type = arrow_type

    def close(self) -> None:
        if self._n:
            self._lib.rwn_free(self._n)
            self._n = ctypes.c_void_p()

    def read(self, reader: native.Parser, codes: np.ndarray) -> Any:
        """The texts of `codes` (int32; a negative code: NULL) as an array of the
        type, or None when one is not of it."""
        codes = np.ascontiguousarray(codes, dtype=np.int32)
        if self._lib.rwn_read(self._n, reader.handle, codes.ctypes.data, len(codes)):
            return None
        nodes = iter(range(int(self._lib.rwn_node_count(self._n))))
        return self._build(self.type, nodes)

    def _node(self, node: int) -> tuple[int, list[int | None], int]:
        """Node's length, the addresses of its validity, values, offsets and string
        data (None where it has none), and the string data's length."""
        addrs = [ctypes.c_void_p() for _ in range(4)]
        data_len = ctypes.c_int64()
        refs = [ctypes.byref(a) for a in addrs]
        n = int(self._lib.rwn_node(self._n, node, *refs, ctypes.byref(data_len)))
        return n, [a.value for a in addrs], data_len.value

    def _build(self, t: Any, nodes: Iterator[int]) -> Any:
        """The array of node next(nodes) and the nodes under it, of type t."""
        import pyarrow as pa

        n, (valid, values, offsets, data), data_len = self._node(next(nodes))
        bufs = [_copy(valid, (n + 7) // 8)]
        if pa.types.is_integer(t):
            return pa.Array.from_buffers(t, n, [*bufs, _copy(values, n * t.bit_width // 8)])
        if pa.types.is_struct(t):
            children = [self._build(f.type, nodes) for f in t]
            return pa.Array.from_buffers(t, n, bufs, children=children)
        bufs.append(_copy(offsets, 4 * (n + 1)) if n else pa.py_buffer(np.zeros(1, np.int32)))
        if t == pa.string():
            return pa.Array.from_buffers(t, n, [*bufs, _copy(data, data_len)])
        if pa.types.is_list(t):
            return pa.Array.from_buffers(t, n, bufs, children=[self._build(t.value_type, nodes)])
        keys = self._build(t.key_type, nodes)
        items = self._build(t.item_type, nodes)
        entries = pa.StructArray.from_arrays([keys, items], fields=[t.key_field, t.item_field])
        return pa.Array.from_buffers(t, n, bufs, children=[entries])


def _copy(addr: int | None, size: int) -> Any:
    """A copy of `size` bytes at addr as an Arrow buffer (the library reuses its own)."""
    import pyarrow as pa

    return pa.py_buffer(ctypes.string_at(addr, size) if size and addr else b"")


class StateChecks:
    """Which rows of a chunk of state records are usable records for the DuckDB
    path (load._STATE_KEYS_OK, the schema check)."""

    def __init__(self, shape: native.Layout) -> None:
        self._slot = {c.name: c.slot for c in shape.columns}

    def _given(self, chunk: native.Chunk, name: str) -> Any:
        return native.unpack(chunk.valid[self._slot[name]], chunk.rows)

    def __call__(self, chunk: native.Chunk, reader: native.Parser) -> list[tuple[str, Any]]:
        """(problem, per row: whether the row is free of it), each check."""
        checks = [(f"{name} missing", self._given(chunk, name)) for name in load.STATE_KEY_FIELDS]
        codes = chunk.values[self._slot["kind"]]
        assert codes is not None
        has_kind = self._given(chunk, "kind")
        kind_codes = np.where(has_kind, codes[: chunk.rows], -1)
        # the few codes a kind has, not the whole dictionary (nested texts are in it)
        used = np.unique(kind_codes[has_kind])
        kinds = tuple(STATE_KIND_OF_TABLE.values())
        known = used[[reader.string(int(c)) in kinds for c in used]]
        unscoped = used[[reader.string(int(c)) in load.STATE_UNSCOPED_KINDS for c in used]]
        checks.append(("kind not one of " + ", ".join(kinds), np.isin(kind_codes, known)))
        is_unscoped = np.isin(kind_codes, unscoped)
        for name in load.STATE_COMM_KEY_FIELDS:
            checks.append((f"{name} missing", is_unscoped | self._given(chunk, name)))
        values = chunk.values[self._slot["schema"]]
        assert values is not None
        newer = (values[: chunk.rows] > schema.SCHEMA_VERSION) & self._given(chunk, "schema")
        checks.append(("newer schema", ~newer))
        return checks


@dataclass
class _Part:
    """A file's rows in a chunk: [start, end)."""

    rf: RecordFile
    start: int
    end: int


class StateReader:
    """Reads state files into Arrow batches, many small files to a chunk (a file's
    buffers and Arrow arrays cost more than parsing its few hundred lines); a
    parser and the nested readers of its texts: one per thread."""

    def __init__(self, chunk_rows: int = native.CHUNK_ROWS) -> None:
        shape = layout()
        self.shape, self.chunk_rows = shape, chunk_rows
        self.reader = native.Parser(shape)
        self.nested: dict[str, NestedReader] = {}
        try:  # what was made is freed when the rest cannot be
            self.checks = StateChecks(shape)
            for name, arrow_type in nested_types().items():
                self.nested[name] = NestedReader(arrow_type)
        except BaseException:
            self.close()
            raise
        self._outcomes: dict[str, native.FileOutcome] = {}

    def close(self) -> None:
        self.reader.close()
        for n in self.nested.values():
            n.close()

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, files: list[RecordFile], outcomes: dict[str, native.FileOutcome]) -> list[Any]:
        """Batches of the records of `files`, but for those whose outcome.reject says
        why they need the DuckDB path."""
        self._outcomes = outcomes
        batches: list[Any] = []
        chunk, parts = None, []
        for rf in files:
            outcome = outcomes[rf.path]
            data = _contents(rf, outcome)
            if data is None:
                continue
            buf = np.frombuffer(data, dtype=np.uint8)
            need = native.count_newlines(buf) + 1  # rows it can have at most
            if chunk is None or self.reader.rows() + need > self.reader.capacity:
                if chunk is not None:
                    batches += self._finish(chunk, parts)
                self.reader.reset()
                chunk, parts = self.reader.bind_chunk(max(self.chunk_rows, need)), []
            self.reader.next_file()
            start = self.reader.rows()
            used = self.reader.parse(buf.ctypes.data, len(buf)) if len(buf) else 0
            self.reader.note_flags(outcome)
            parts.append(_Part(rf, start, self.reader.rows()))
            outcome.rows = self.reader.rows() - start
            if used < len(buf):  # cannot be: the chunk had room for every line
                outcome.reject = "more records than lines"
            elif outcome.flagged_total:  # a truncated last line too: the DuckDB path decides
                outcome.reject = "flagged line(s): " + ", ".join(
                    f"{line} ({why})" for line, why in outcome.flagged[:3]
                )
            elif outcome.rows != outcome.lines:
                outcome.reject = "blank lines"  # the DuckDB path counts lines its own way
        if chunk is not None:
            batches += self._finish(chunk, parts)
        return batches

    def _finish(self, chunk: native.Chunk, parts: list[_Part]) -> list[Any]:
        """The chunk's rows of the files taken, as batches (none when none is)."""
        chunk.rows = self.reader.rows()
        # each file's first failed check, from the rows that fail one (few or none):
        # not a check of every file's rows in turn (a thousand ranks' files)
        ends = np.array([part.end for part in parts], dtype=np.int64)
        for problem, ok in self.checks(chunk, self.reader):
            for i in np.unique(np.searchsorted(ends, np.flatnonzero(~ok), side="right")):
                outcome = self._outcome(parts[i])
                if not outcome.reject:
                    outcome.reject = problem
        nested = self._nested_columns(chunk, parts)
        taken = [p for p in parts if not self._outcome(p).reject]
        if not taken:
            return []
        batch = self._batch(chunk, self.reader.dictionary(), nested, parts)
        if len(taken) == len(parts):
            return [batch]
        # the files' rows are contiguous: slices, where a filter would copy
        return [batch.slice(p.start, p.end - p.start) for p in taken if p.end > p.start]

    def _outcome(self, part: _Part) -> native.FileOutcome:
        return self._outcomes[part.rf.path]

    def _nested_columns(self, chunk: native.Chunk, parts: list[_Part]) -> dict[str, Any]:
        """Each nested column of the rows of files not rejected; a file with a text
        the nested reader does not take is rejected (found by reading each file's
        texts on their own, once reading them all together failed)."""
        while True:
            taken = [p for p in parts if not self._outcome(p).reject]
            rows = np.zeros(chunk.rows, dtype=bool)
            for p in taken:
                rows[p.start : p.end] = True
            columns = {}
            for c in self.shape.columns:
                if c.code == "r":
                    columns[c.name] = self._nested(c.name, chunk, c.slot, rows)
            if all(v is not None for v in columns.values()):
                return columns
            why = "a value json_transform types its own way"
            for p in taken:
                only = np.zeros(chunk.rows, dtype=bool)
                only[p.start : p.end] = True
                for c in self.shape.columns:
                    if c.code == "r" and self._nested(c.name, chunk, c.slot, only) is None:
                        self._outcome(p).reject = f"{c.name}: {why}"
                        break
            if all(not self._outcome(p).reject for p in taken):  # never so: each text is
                for p in taken:  # some file's; still, no file is taken on a failed read
                    self._outcome(p).reject = why

    def _nested(self, name: str, chunk: native.Chunk, slot: int, rows: Any) -> Any:
        """The nested column `name`, NULL where the field is or outside `rows`; None
        when a text is not of its type."""
        codes = chunk.values[slot]
        assert codes is not None
        given = native.unpack(chunk.valid[slot], chunk.rows) & rows
        return self.nested[name].read(self.reader, np.where(given, codes[: chunk.rows], -1))

    def _batch(
        self, chunk: native.Chunk, dictionary: Any, nested: dict[str, Any], parts: list[_Part]
    ) -> Any:
        """All rows of the chunk: `source_file`, then every field by its name."""
        import pyarrow as pa

        rows = chunk.rows
        counts = [p.end - p.start for p in parts]
        files = np.repeat(np.arange(len(parts), dtype=np.int32), counts)
        paths = pa.array([p.rf.path for p in parts], type=pa.string())
        arrays = [pa.DictionaryArray.from_arrays(files, paths)]
        for c in self.shape.columns:
            if c.code == "r":
                arrays.append(nested[c.name])
                continue
            values = chunk.values[c.slot]
            assert values is not None
            valid = pa.py_buffer(chunk.valid[c.slot])
            arrays.append(native.column_array(c.code, rows, values, valid, dictionary))
        names = ["source_file", *(c.name for c in self.shape.columns)]
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _contents(rf: RecordFile, outcome: native.FileOutcome) -> bytes | None:
    """The file's bytes (decompressed), or None with outcome.reject saying why."""
    try:
        if rf.compressed:
            with gzip.open(rf.path, "rb") as stream:
                return stream.read()
        with open(rf.path, "rb") as stream:
            return stream.read()
    except (OSError, EOFError, ValueError) as exc:  # e.g. a cut gzip stream
        outcome.reject = f"could not read: {exc}"
        return None


def load_files(con: Any, files: list[RecordFile], workers: int) -> dict[str, native.FileOutcome]:
    """Read `files` with `workers` parsing threads and insert the records of those
    taken whole into comms, progress, clock and stats; returns their outcomes (a
    file not among them needs the DuckDB path). The inserts run on connections of
    their own (cursors of con)."""
    with _Cursors(con) as cursors:
        return _load(cursors, files, workers)


def load_files_in_background(
    con: Any, files: list[RecordFile], workers: int
) -> Callable[[], dict[str, native.FileOutcome]]:
    """load_files in a thread of its own (while the op files are read: it uses no
    connection the caller uses); the call returned waits for it and returns its
    outcomes, or raises what it raised."""
    cursors = _Cursors(con)  # made here: a connection is not shared across threads

    def run() -> dict[str, native.FileOutcome]:
        with cursors:
            return _load(cursors, files, workers)

    return background.start(run)


class _Cursors:
    """Two connections to con's database (its cursors), each using the catalog con
    uses: the inserts of progress and of the other kinds, beside each other."""

    def __init__(self, con: Any) -> None:
        ((database,),) = con.execute("SELECT current_database()").fetchall()
        self.progress, self.others = con.cursor(), con.cursor()
        use = 'USE "' + database.replace('"', '""') + '"'
        for cursor in (self.progress, self.others):
            cursor.execute(use).fetchall()

    def __enter__(self) -> _Cursors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.close()
        self.others.close()


def _load(cursors: _Cursors, files: list[RecordFile], workers: int) -> dict[str, Any]:
    import pyarrow as pa

    outcomes = {f.path: native.FileOutcome() for f in files}

    def work(mine: list[RecordFile]) -> list[Any]:
        with StateReader() as reader:
            return reader.read(mine, outcomes)

    n = max(1, min(workers, len(files)))
    batches = background.run_all([functools.partial(work, files[i::n]) for i in range(n)])
    taken = [b for part in batches for b in part]
    if taken:
        table = pa.Table.from_batches(taken)
        kinds = [t for t in STATE_KIND_OF_TABLE if t != "progress"]
        # progress (its nested values take DuckDB most of the time) beside the others
        inserts = [functools.partial(_insert, cursors.progress, table, ["progress"]),
                   functools.partial(_insert, cursors.others, table, kinds)]  # fmt: skip
        try:
            background.run_all(inserts)
        except duckdb.Error:  # a value no table takes: every file to DuckDB's reader,
            # whose careful path reports the file that has it and loads the others
            load.delete_state_files(cursors.others, [f.path for f in files])
            return {}
    return {p: o for p, o in outcomes.items() if not o.reject}


def _insert(cursor: Any, table: Any, targets: list[str]) -> None:
    """The records of `table` into the `targets` tables, on `cursor`."""
    cursor.register(SOURCE, table)
    try:
        for target in targets:
            cursor.execute(load.state_insert_sql(target, SOURCE))
    finally:
        cursor.unregister(SOURCE)
