"""The collective ops' alignment columns, kept while the native reader parses.

Aligning collectives needs, of every collective op, only its communicator,
function, sequence number, rank, process, message size and three times. The
native reader (native.py) has them in typed columns before DuckDB ever sees
them; keeping a compact copy here lets the compiled alignment
(rankwatch.align.kernels) run over them without reading the ops table back out
of DuckDB, which costs about what the kernel saves.

What a row keeps: its member (one rank of one communicator in one process: the
header's id, name, rank and size, the host and the pid, interned job-wide, a
few hundred per job), its function (a string code), seq, message size, the
three times, its clock error and a byte of validity bits: 57 bytes per
collective op. Strings
(hosts, communicator ids and keys, names, functions) share one job-wide
dictionary.

Parsing threads add chunks concurrently (`add`); a file the native reader hands
on to the DuckDB path is dropped again (`drop`); `finish()` joins the parts
into CollectiveColumns. Those columns equal the ops table's collective rows
only while every op row came through the native reader: rankwatch.align checks
the row count before it trusts them, and otherwise aligns with SQL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The ops columns a captured row (or its member) holds, each read from one field
# of the record (rankwatch.store.native.column_for: the lean projection's field).
MEMBER_COLUMNS = ("comm_id", "comm_name", "rank", "n_ranks", "host", "pid")
ROW_COLUMNS = ("func", "seq", "msg_bytes", "arrival_ns", "gpu_start_ns", "gpu_end_ns",
               "clock_error_ns", "complete")  # fmt: skip
KIND_COLUMN = "kind"
# validity bits of a row's nullable columns, and one for `complete` being false
# (native/rwalign.h: RWA_V_*)
VALID_BITS = {"msg_bytes": 1, "arrival_ns": 2, "gpu_start_ns": 4, "gpu_end_ns": 8,
              "clock_error_ns": 16}  # fmt: skip
INCOMPLETE_BIT = 32
TIMES = ("msg_bytes", "arrival_ns", "gpu_start_ns", "gpu_end_ns", "clock_error_ns")

# A member as interned: (comm_id, comm_name or -1, rank, n_ranks or None, host,
# pid, comm_key or -1), strings as job-wide codes.
Member = tuple[int, int, int, "int | None", int, int, int]

_FAST_CODE_BITS, _FAST_INT_BITS = 12, 20  # member keys packed into 64 bits (see _members)


@dataclass
class _Part:
    """The collective rows of one chunk: `member` (int32), `func` (int32 string
    code), `seq` (int64), TIMES (int64, 0 where NULL) and `valid` (uint8, VALID_BITS)."""

    columns: dict[str, np.ndarray]


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

    @property
    def rows(self) -> int:
        return len(self.seq)

    @property
    def nbytes(self) -> int:
        arrays = [self.member, self.func, self.seq, self.valid, *self.values.values()]
        return sum(a.nbytes for a in arrays)


@dataclass
class _FileState:
    remap: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    key_remap: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    parts: list[_Part] = field(default_factory=list)
    member_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    member_codes: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))


class CollectiveCapture:
    """Collects CollectiveColumns from the native reader's chunks (thread-safe)."""

    def __init__(self, slots: dict[str, int]) -> None:
        """slots: the layout slot of each column in MEMBER_COLUMNS, ROW_COLUMNS and
        KIND_COLUMN."""
        self._slots = slots
        self._lock = threading.Lock()
        self._codes: dict[str, int] = {}
        self._strings: list[str] = []
        self._members: dict[Member, int] = {}
        self._files: dict[str, _FileState] = {}

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
        values, valid = chunk.values, chunk.valid
        kind = values[self._slots[KIND_COLUMN]][:rows]
        picked = np.flatnonzero(kind == strings.index("coll"))
        if not len(picked):
            return

        def take(name: str) -> np.ndarray:
            return values[self._slots[name]][picked]

        def present(name: str) -> np.ndarray:
            bits = np.unpackbits(valid[self._slots[name]], count=rows, bitorder="little")
            return bits[picked]

        flags = np.zeros(len(picked), dtype=np.uint8)
        times = {}
        for name in TIMES:
            ok = present(name)
            flags |= ok * np.uint8(VALID_BITS[name])
            times[name] = np.where(ok.astype(bool), take(name), 0)
        done = np.unpackbits(values[self._slots["complete"]], count=rows, bitorder="little")
        incomplete = present("complete") & ~done[picked] & np.uint8(1)  # false, not NULL
        flags |= incomplete * np.uint8(INCOMPLETE_BIT)
        member = self._members_of(state, take, present)
        columns = {"member": member, "func": state.remap[take("func")], "seq": take("seq")}
        state.parts.append(_Part({**columns, **times, "valid": flags}))

    def _members_of(self, state: _FileState, take: Any, present: Any) -> np.ndarray:
        """Each row's member code, interning the chunk's distinct members."""
        cid, cname = take("comm_id"), take("comm_name")
        cname = np.where(present("comm_name").astype(bool), cname, -1)
        rank = take("rank")
        n_ranks = np.where(present("n_ranks").astype(bool), take("n_ranks"), -1)
        host, pid = take("host"), take("pid")
        key = _packed(cid, cname, rank, n_ranks, host, pid)
        if key is not None and len(state.member_keys):
            # the usual chunk: members its file had before (a sorted lookup, no sort)
            at = np.minimum(np.searchsorted(state.member_keys, key), len(state.member_keys) - 1)
            if bool((state.member_keys[at] == key).all()):
                return state.member_codes[at]
        if key is not None:
            uniq, inverse = np.unique(key, return_inverse=True)
            firsts = np.zeros(len(uniq), dtype=np.int64)
            firsts[inverse] = np.arange(len(key))  # any row of each member will do
        else:  # a rare chunk (several processes, huge codes or ranks): slower, same result
            table = np.stack([cid, cname, rank, n_ranks, host, pid], axis=1).astype(np.int64)
            uniq, firsts, inverse = np.unique(table, axis=0, return_index=True, return_inverse=True)
        codes = np.empty(len(uniq), dtype=np.int32)
        remap, key_remap = state.remap, state.key_remap
        with self._lock:
            for j, i in enumerate(firsts.tolist()):
                member: Member = (
                    int(remap[cid[i]]),
                    int(remap[cname[i]]) if cname[i] >= 0 else -1,
                    int(rank[i]),
                    int(n_ranks[i]) if n_ranks[i] >= 0 else None,
                    int(remap[host[i]]),
                    int(pid[i]),
                    int(key_remap[cid[i]]),
                )
                code = self._members.get(member)
                if code is None:
                    code = self._members[member] = len(self._members)
                codes[j] = code
        if key is not None:  # remember the file's packed members, sorted
            merged = np.concatenate([state.member_keys, uniq])
            order = np.argsort(merged, kind="stable")
            merged, first = np.unique(merged[order], return_index=True)
            state.member_codes = np.concatenate([state.member_codes, codes])[order][first]
            state.member_keys = merged
        return codes[np.asarray(inverse).reshape(-1)]

    def drop(self, path: str) -> None:
        """Forget what was kept of `path` (the file goes through the DuckDB path)."""
        self._files.pop(path, None)

    # ------------------------------------------------------------- finish

    def finish(self) -> CollectiveColumns:
        """The kept rows as one set of columns (the parts are released as they are
        joined, one column at a time)."""
        parts = [p for path in sorted(self._files) for p in self._files[path].parts]
        self._files = {}

        def join(name: str, dtype: Any) -> np.ndarray:
            arrays = [p.columns.pop(name) for p in parts]  # the parts' copies go with these
            return np.concatenate(arrays) if arrays else np.empty(0, dtype=dtype)

        member, func = join("member", np.int32), join("func", np.int32)
        seq, valid = join("seq", np.int64), join("valid", np.uint8)
        values = {name: join(name, np.int64) for name in TIMES}
        members = [m for m, _ in sorted(self._members.items(), key=lambda item: item[1])]
        return CollectiveColumns(list(self._strings), members, member, func, seq, values, valid)


def _packed(
    cid: np.ndarray,
    cname: np.ndarray,
    rank: np.ndarray,
    n_ranks: np.ndarray,
    host: np.ndarray,
    pid: np.ndarray,
) -> np.ndarray | None:
    """A chunk's member keys packed into one uint64 each, when its rows share one
    host and pid (one process's file) and the codes and ranks fit; else None."""
    if not len(cid):
        return None
    if host.min() != host.max() or pid.min() != pid.max():
        return None
    code_top, int_top = 1 << _FAST_CODE_BITS, 1 << _FAST_INT_BITS
    if cid.max() >= code_top or cname.max() + 1 >= code_top:
        return None
    if rank.min() < 0 or rank.max() >= int_top or n_ranks.max() + 1 >= int_top:
        return None
    key = cid.astype(np.uint64) << np.uint64(_FAST_CODE_BITS + 2 * _FAST_INT_BITS)
    key |= (cname + 1).astype(np.uint64) << np.uint64(2 * _FAST_INT_BITS)
    key |= rank.astype(np.uint64) << np.uint64(_FAST_INT_BITS)
    key |= (n_ranks + 1).astype(np.uint64)
    return key
