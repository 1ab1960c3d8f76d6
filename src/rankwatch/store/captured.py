"""The collective ops' alignment columns, kept while the native reader parses.

Aligning collectives and host clocks needs, of every collective op, only its
communicator, function, sequence number, rank, process, message size, three
times, clock error and whether it completed. The native reader (native.py) has
them in typed columns before DuckDB ever sees them; keeping a compact copy here
lets the compiled alignment (rankwatch.align.kernels) run over them without
reading the ops table back out of DuckDB, which costs about what the kernel
saves.

What a row keeps: its member (one rank of one communicator in one process: the
header's id, name, rank and size, the host and the pid, interned job-wide, a
few hundred per job), its function (a string code), seq, message size, the
three times, its clock error and a byte of validity bits (completion among
them): 57 bytes per collective op. Strings (hosts, communicator ids and keys,
names, functions) share one job-wide dictionary.

Each chunk's collective rows are picked and laid out in C (rwp_capture in
native/rwparse.c, one call per chunk, the GIL released); interning members stays
here, a sorted lookup for a file's later chunks.

Parsing threads add chunks concurrently (`add`); a file the native reader hands
on to the DuckDB path is dropped again (`drop`); `finish()` joins the parts
into CollectiveColumns. Those columns equal the ops table's collective rows
only while every op row came through the native reader: rankwatch.align checks
the row count before it trusts them, and otherwise aligns with SQL.
"""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.store.bitmaps import bits_at
from rankwatch.store.slabs import Slabs, anonymous, scratch

# The chunk columns rwp_capture reads (native/rwkept.h: RW_C_*), each the ops column
# of that name as the native reader fills it (rankwatch.store.native.capture_slots).
CAPTURE_COLUMNS = ("kind", "func", "seq", "msg_bytes", "arrival_ns", "gpu_start_ns",
                   "gpu_end_ns", "clock_error_ns", "complete", "comm_id", "comm_name", "rank",
                   "n_ranks", "host", "pid")  # fmt: skip
# validity bits of a row's nullable columns, and one for `complete` being false
# (native/rwkept.h: RW_V_*)
VALID_BITS = {"msg_bytes": 1, "arrival_ns": 2, "gpu_start_ns": 4, "gpu_end_ns": 8,
              "clock_error_ns": 16}  # fmt: skip
INCOMPLETE_BIT = 32
TIMES = ("msg_bytes", "arrival_ns", "gpu_start_ns", "gpu_end_ns", "clock_error_ns")
MEMBER_COLUMNS = ("comm_id", "comm_name", "rank", "n_ranks", "host", "pid")

# A member as interned: (comm_id, comm_name or -1, rank, n_ranks or None, host,
# pid, comm_key or -1), strings as job-wide codes.
Member = tuple[int, int, int, "int | None", int, int, int]


class _Capture:
    """rwp_capture's output buffers for a chunk of `rows` rows: this thread's
    scratch, used again for its next chunk (what is kept of them is copied:
    CollectiveCapture._kept). Fresh for each chunk, they cost a page fault per
    4 KiB filled."""

    def __init__(self, rows: int) -> None:
        self.row = scratch("capture.row", rows, np.int32)
        self.func = scratch("capture.func", rows, np.int32)
        self.seq = scratch("capture.seq", rows, np.int64)
        self.values = {name: scratch(f"capture.{name}", rows, np.int64) for name in TIMES}
        self.valid = scratch("capture.valid", rows, np.uint8)
        self.key = scratch("capture.key", rows, np.uint64)
        self.proc = scratch("capture.proc", rows, np.int32)


def _joined(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The arrays end to end, in a mapping of their own (huge pages: one fault per
    2 MiB, where NumPy's fresh memory faulted per 4 KiB)."""
    total = sum(len(a) for a in arrays)
    out = anonymous(total * np.dtype(dtype).itemsize).view(dtype)
    if arrays:
        np.concatenate(arrays, out=out)
    return out


@dataclass
class CollectiveColumns:
    """Every collective op of a job (rows in no particular order) and the
    dictionaries their codes index."""

    strings: list[str]  # by job-wide code
    members: list[Member]  # by member code
    member: np.ndarray
    func: np.ndarray
    seq: np.ndarray
    values: dict[str, np.ndarray]
    valid: np.ndarray
    # the rows cut into passes (align.kernels.Partition) by number of passes: the
    # clock's passes and the collectives' read the same ones
    partitions: dict[int, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.seq)


@dataclass
class _FileState:
    remap: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    key_remap: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    # the collective rows of each chunk: `member` (int32), `func` (int32 string
    # code), `seq` (int64), TIMES (int64, 0 where NULL), `valid` (uint8, VALID_BITS)
    parts: list[dict[str, np.ndarray]] = field(default_factory=list)
    member_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    member_codes: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))


class CollectiveCapture:
    """Collects CollectiveColumns from the native reader's chunks (thread-safe)."""

    def __init__(self, slots: dict[str, int], lib: ctypes.CDLL) -> None:
        """slots: the layout slot of each of CAPTURE_COLUMNS; lib: the native
        reader's library (rwp_capture)."""
        self._slots = slots
        self._lib = lib
        self._lock = threading.Lock()
        self._codes: dict[str, int] = {}
        self._strings: list[str] = []
        self._members: dict[Member, int] = {}
        self._files: dict[str, _FileState] = {}
        # where the parts are kept, by (thread, column): see _kept
        self._slabs: dict[tuple[int, str], Slabs] = {}

    # ------------------------------------------------------------ strings

    def _code(self, text: str | None) -> int:
        if text is None:
            return -1
        code = self._codes.get(text)
        if code is None:
            code = self._codes[text] = len(self._strings)
            self._strings.append(text)
        return code

    def _remaps(self, state: _FileState, strings: list[str], keys: list[str | None]) -> None:
        """Extend the file's local-to-job-wide code maps to its dictionary so far."""
        known = len(state.remap)
        if known == len(strings):
            return
        with self._lock:
            new = [self._code(s) for s in strings[known:]]
            new_keys = [self._code(k) for k in keys[known : len(strings)]]
        state.remap = np.concatenate([state.remap, np.array(new, dtype=np.int32)])
        state.key_remap = np.concatenate([state.key_remap, np.array(new_keys, dtype=np.int32)])

    # ------------------------------------------------------------- chunks

    def add(self, path: str, chunk: Any, strings: list[str], keys: list[str | None]) -> None:
        """Keep the collective rows of one parsed chunk of `path` (a native.Chunk
        whose rows passed the reader's checks: key columns present, kind known)."""
        rows = chunk.rows
        if "coll" not in strings or rows == 0:
            return
        state = self._files.setdefault(path, _FileState())
        self._remaps(state, strings, keys)
        out = _Capture(rows)
        slots = [self._slots[name] for name in CAPTURE_COLUMNS]
        values = (ctypes.c_void_p * len(slots))(*[chunk.values[k].ctypes.data for k in slots])
        valid = (ctypes.c_void_p * len(slots))(*[chunk.valid[k].ctypes.data for k in slots])
        times = (ctypes.c_void_p * len(TIMES))(*[out.values[name].ctypes.data for name in TIMES])
        packed = ctypes.c_int64(0)
        got = self._lib.rwp_capture(
            rows, values, valid, strings.index("coll"), state.remap.ctypes.data,
            len(state.remap), out.row.ctypes.data, out.func.ctypes.data, out.seq.ctypes.data,
            times, out.valid.ctypes.data, out.key.ctypes.data, out.proc.ctypes.data,
            ctypes.byref(packed),
        )  # fmt: skip
        if got < 0:
            raise ValueError(f"{path}: a function code out of range")
        if got == 0:
            return
        picked = out.row[:got]
        if packed.value == 2:  # several processes: a unit of files read as one chunk
            member = self._members_of_processes(state, chunk, picked, out.key[:got],
                                                out.proc[:got])  # fmt: skip
        else:
            key = out.key[:got] if packed.value else None
            member = self._members_of(state, chunk, picked, key)
        kept = self._kept
        columns = {"member": kept("member", member)}
        columns |= {"func": kept("func", out.func[:got]), "seq": kept("seq", out.seq[:got])}
        columns |= {name: kept(name, out.values[name][:got]) for name in TIMES}
        state.parts.append(columns | {"valid": kept("valid", out.valid[:got])})

    def _kept(self, column: str, a: np.ndarray) -> np.ndarray:
        """A copy of `a` in this thread's slabs for `column` (huge pages:
        store.slabs), kept until finish() joins the parts: a column's slabs are
        unmapped once it is joined, so the parts and the joined columns are never
        all in memory at once."""
        key = (threading.get_ident(), column)
        slabs = self._slabs.get(key)
        if slabs is None:
            slabs = self._slabs[key] = Slabs()
        out = slabs.take(a.nbytes).view(a.dtype)
        out[...] = a
        return out

    def _members_of_processes(
        self, state: _FileState, chunk: Any, picked: np.ndarray, key: np.ndarray,
        proc: np.ndarray,
    ) -> np.ndarray:  # fmt: skip
        """_members_of for a chunk of several processes: members are the distinct
        (process, packed key) pairs, found by one sort (not remembered: a unit's
        files are read once, in one chunk)."""
        order = np.lexsort((key, proc))
        key, proc = key[order], proc[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (key[1:] != key[:-1]) | (proc[1:] != proc[:-1])
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.cumsum(new) - 1
        codes = self._member_codes(state, chunk, picked[order[new]].tolist())
        return codes[inverse]

    def _member_codes(self, state: _FileState, chunk: Any, rows: list[int]) -> np.ndarray:
        """The job-wide code of the member of each of these rows (interned if new)."""
        codes = np.empty(len(rows), dtype=np.int32)
        with self._lock:
            for j, row in enumerate(rows):
                member = self._member(state, chunk, row)
                code = self._members.get(member)
                if code is None:
                    code = self._members[member] = len(self._members)
                codes[j] = code
        return codes

    def _members_of(
        self, state: _FileState, chunk: Any, picked: np.ndarray, key: np.ndarray | None
    ) -> np.ndarray:
        """Each picked row's member code, interning the chunk's distinct members;
        `key`: the rows' packed members when rwp_capture could pack them."""
        if key is not None and len(state.member_keys):
            # the usual chunk: members its file had before (a sorted lookup, no sort)
            at = np.minimum(np.searchsorted(state.member_keys, key), len(state.member_keys) - 1)
            if bool((state.member_keys[at] == key).all()):
                return state.member_codes[at]
        if key is not None and bool((key == key[0]).all()):
            # one member (a rank in one communicator, common): no sort needed
            uniq, inverse = key[:1], np.zeros(len(key), dtype=np.int64)
            firsts = np.zeros(1, dtype=np.int64)
        elif key is not None:
            uniq, inverse = np.unique(key, return_inverse=True)
            firsts = np.zeros(len(uniq), dtype=np.int64)
            firsts[inverse] = np.arange(len(key))  # any row of each member will do
        else:  # a rare chunk (huge codes or ranks, thousands of processes): slower, same result
            table = np.stack([self._column(chunk, name, picked) for name in MEMBER_COLUMNS]
                             + [self._present(chunk, "comm_name", picked),
                                self._present(chunk, "n_ranks", picked)], axis=1)  # fmt: skip
            uniq, firsts, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
        codes = self._member_codes(state, chunk, picked[firsts].tolist())
        if key is not None:  # remember the file's packed members, sorted
            merged = np.concatenate([state.member_keys, uniq])
            order = np.argsort(merged, kind="stable")
            merged, first = np.unique(merged[order], return_index=True)
            state.member_codes = np.concatenate([state.member_codes, codes])[order][first]
            state.member_keys = merged
        return codes[np.asarray(inverse).reshape(-1)]

    def _column(self, chunk: Any, name: str, rows: np.ndarray) -> np.ndarray:
        return chunk.values[self._slots[name]][rows].astype(np.int64)

    def _present(self, chunk: Any, name: str, rows: Any) -> Any:
        """Validity of column `name` at `rows` (an index array, or one row): 1 or 0."""
        bits = chunk.valid[self._slots[name]]
        return bits_at(bits, rows).astype(np.int64)

    def _member(self, state: _FileState, chunk: Any, row: int) -> Member:
        """The member of one row of the chunk, its strings as job-wide codes."""

        def value(name: str) -> int:
            return int(chunk.values[self._slots[name]][row])

        cid = value("comm_id")
        named = bool(self._present(chunk, "comm_name", row))
        sized = bool(self._present(chunk, "n_ranks", row))
        return (
            int(state.remap[cid]),
            int(state.remap[value("comm_name")]) if named else -1,
            value("rank"),
            value("n_ranks") if sized else None,
            int(state.remap[value("host")]),
            value("pid"),
            int(state.key_remap[cid]),
        )

    def drop(self, path: str) -> None:
        """Forget what was kept of `path` (the file goes through the DuckDB path)."""
        self._files.pop(path, None)

    # ------------------------------------------------------------- finish

    def finish(self) -> CollectiveColumns:
        """The kept rows as one set of columns (the parts are released as they are
        joined, a column at a time, two columns at once: at 10 M records the copies
        take 0.3 s, while the caller waits)."""
        parts = [p for path in sorted(self._files) for p in self._files[path].parts]
        self._files = {}
        self._slabs = {}  # each slab is unmapped once its column's parts are joined
        dtypes = {"member": np.int32, "func": np.int32, "seq": np.int64, "valid": np.uint8}
        dtypes |= {name: np.int64 for name in TIMES}

        def join(name: str) -> np.ndarray:
            arrays = [p.pop(name) for p in parts]  # the parts' copies go with these
            return _joined(arrays, dtypes[name])

        with ThreadPoolExecutor(max_workers=2) as pool:  # NumPy copies without the GIL
            joined = dict(zip(dtypes, pool.map(join, dtypes), strict=True))
        member, func, seq, valid = (joined[name] for name in ("member", "func", "seq", "valid"))
        values = {name: joined[name] for name in TIMES}
        members = [m for m, _ in sorted(self._members.items(), key=lambda item: item[1])]
        return CollectiveColumns(list(self._strings), members, member, func, seq, values, valid)
