"""Compiled kernels of the alignment (native/rwalign.c, loaded with ctypes).

`collectives_from_kept` computes what COLLECTIVES_QUERY's hash aggregations and
joins compute (each collective's `joined` row) and what RANK_LATENESS_SQL sums
per world rank, from the collective ops' columns the native reader kept while
parsing (rankwatch.store.captured), without reading the ops table back out of
DuckDB: rwa_prepare maps each row to the reference clock and its world rank,
rwa_group groups rows by (communicator, function, seq), rwa_collectives forms
every group's row and adds to the ranks' lateness. The SQL stays the reference
and the fallback: it runs where the library is missing, under RANKWATCH_NATIVE=0,
where the kept columns do not match the ops table (some ops came through another
reader), and when a kernel declines (an int64 overflow, which SQL reports as an
error); the tests compare both.

The column orders below mirror the enums of native/rwalign.h (a test checks).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch import nativelib
from rankwatch.align import groups
from rankwatch.store.captured import CollectiveColumns
from rankwatch.store.slabs import release_scratch, scratch

LIB_FILENAME = "librankwatch-rwalign.so"

# rwalign.h: per-row inputs, per-collective outputs, per-world-rank accumulators
IN_COLUMNS = ("member", "msg_bytes", "arrival_c", "gpu_start_c", "gpu_end_c", "duration",
              "clock_error", "complete")  # fmt: skip
OUT_I64 = ("n_ranks", "n_seen", "hosts", "msg_bytes", "size_mismatch", "first_arrival",
           "last_arrival", "second_last_arrival", "last_rank", "last_world_rank", "last_host",
           "first_gpu_start", "last_gpu_start", "second_last_gpu_start", "last_gpu_world_rank",
           "first_gpu_end", "last_gpu_end", "end_minus_last_start", "min_duration", "comm_id",
           "comm_name")  # fmt: skip
OUT_F64 = ("median_arrival", "median_gpu_start", "lag_bound_ns")
LATE_I64 = ("collectives", "last_arrivals", "arrival_lag_sum", "arrival_lag_n",
            "last_gpu_starts", "gpu_lag_sum", "gpu_lag_n", "significant_arrivals",
            "significant_gpu_starts", "host", "arrival_vs_median_n", "gpu_vs_median_n",
            "bound_n")  # fmt: skip
LATE_F64 = ("arrival_vs_median_sum", "gpu_vs_median_sum", "max_bound")
MEMBER_COLUMNS = ("comm_key", "comm_id", "comm_name", "rank", "n_ranks", "n_ranks_ok", "host",
                  "world_rank", "world_ok", "world_code")  # fmt: skip


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    sigs = {
        "rwa_group": [i64, p, p, p, p, i64, p, p, p, p, p],
        "rwa_collectives": [i64, p, p, i64, p, p, i64, p, i64, p, p, i64, *[p] * 7],
        "rwa_prepare": [i64, *[p] * 9, i64, p, i64, p, i64, *[p] * 4, i64, p, i64, *[p] * 6],
        "rwa_partition": [i64, p, i64, i64, p, p, p],
        "rwa_clock_obs": [i64, p, p, i64, p, p, i64, p, p, i64, p, i64, p, p, i64, i64, i64,
                          *[p] * 7],
        "rwa_clock_pairs": [
            ctypes.c_int,
            i64,
            *[p] * 7,
            i64,
            p,
            i64,
            ctypes.c_double,
            i64,
            i64,
            *[p] * 10,
        ],
        "rwa_medians": [i64, p, p, p],
    }
    return nativelib.bind_int64(lib, sigs)


def library() -> ctypes.CDLL | None:
    """The kernels, or None (not built, or RANKWATCH_NATIVE=0)."""
    return nativelib.kernels(LIB_FILENAME, _bind)


class Declined(Exception):
    """The kept columns cannot give the SQL form's tables: align with SQL."""


def _library() -> ctypes.CDLL:
    """The kernels; Declined where they are not available (the SQL form runs)."""
    lib = library()
    if lib is None:
        raise Declined("rwalign is not available")
    return lib


def _p(a: np.ndarray) -> int:
    if not a.flags.c_contiguous:  # a strided view's pointer would read other elements
        raise ValueError("kernels take C-contiguous arrays")
    return a.ctypes.data


# -------------------------------------------------------------- rank lateness


@dataclass
class Lateness:
    """RANK_LATENESS_SQL's per-world-rank sums, added to by every pass."""

    hosts: list[str]  # every host of the job, sorted: the members' host codes
    worlds: list[int]  # every world rank of the job, sorted; NULL is code len(worlds)
    i64: np.ndarray = field(init=False)
    f64: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.worlds) + 1
        self.i64 = np.zeros((len(LATE_I64), n), dtype=np.int64)
        self.i64[LATE_I64.index("host")] = -1
        self.f64 = np.zeros((len(LATE_F64), n), dtype=np.float64)

    def add(self, other: Lateness) -> None:
        """Add another pass's sums (counts and sums add; the host is the smallest
        seen, the bound the largest)."""
        host, top, top_n = (
            LATE_I64.index("host"),
            LATE_F64.index("max_bound"),
            LATE_I64.index("bound_n"),
        )
        hosts = np.where(self.i64[host] < 0, other.i64[host],
                         np.where(other.i64[host] < 0, self.i64[host],
                                  np.minimum(self.i64[host], other.i64[host])))  # fmt: skip
        bound = np.where(self.i64[top_n] == 0, other.f64[top],
                         np.where(other.i64[top_n] == 0, self.f64[top],
                                  np.maximum(self.f64[top], other.f64[top])))  # fmt: skip
        self.i64 += other.i64
        self.f64 += other.f64
        self.i64[host], self.f64[top] = hosts, bound

    def rows(self) -> dict[str, list[Any]]:
        """RANK_LATENESS_SQL's columns (before its casts), one entry per world rank seen."""
        li = dict(zip(LATE_I64, self.i64, strict=True))
        lf = dict(zip(LATE_F64, self.f64, strict=True))
        seen = np.flatnonzero(li["collectives"] > 0)
        worlds = [*self.worlds, None]

        def mean(total: np.ndarray, count: np.ndarray) -> list[float | None]:
            return [float(total[w]) / int(count[w]) if count[w] else None for w in seen]

        return {
            "world_rank": [worlds[w] for w in seen],
            "host": [self.hosts[li["host"][w]] if li["host"][w] >= 0 else None for w in seen],
            "collectives": li["collectives"][seen].tolist(),
            "times_last_arrival": li["last_arrivals"][seen].tolist(),
            "arrival_lag_caused_ns": li["arrival_lag_sum"][seen].tolist(),
            "mean_last_arrival_lag_ns": mean(li["arrival_lag_sum"], li["arrival_lag_n"]),
            "times_last_gpu_start": li["last_gpu_starts"][seen].tolist(),
            "gpu_lag_caused_ns": li["gpu_lag_sum"][seen].tolist(),
            "mean_last_gpu_lag_ns": mean(li["gpu_lag_sum"], li["gpu_lag_n"]),
            "mean_arrival_lag_ns": mean(lf["arrival_vs_median_sum"], li["arrival_vs_median_n"]),
            "mean_gpu_lag_ns": mean(lf["gpu_vs_median_sum"], li["gpu_vs_median_n"]),
            "max_lag_bound_ns": [
                float(lf["max_bound"][w]) if li["bound_n"][w] else None for w in seen
            ],
            "significant_last_arrivals": li["significant_arrivals"][seen].tolist(),
            "significant_last_gpu_starts": li["significant_gpu_starts"][seen].tolist(),
        }


# ------------------------------------------------------------------- the job

# Collective ops per compiled pass: about 190 bytes of memory each (rwa_prepare's
# rows and rwa_group's arrays); rwa_partition lists each pass's rows once. Smaller
# passes fault in less fresh memory: the passes after the first ones reuse what
# those freed (at 1 M ops, passes of 250,000 instead of 500,000 took align from
# 0.84-0.89 to 0.71-0.77 s and its peak RSS from 680 to 550-600 MB).
ROWS_PER_PASS = 250_000
PASS_ID_BITS = 40  # clock observations of pass i are numbered from i << PASS_ID_BITS
PARTITION_BUCKETS = 1 << 20  # seq buckets that rwa_partition cuts into passes
MAX_WORKERS = 4  # passes in flight at once, each holding its rows (about 48 MB)


def passes(rows: int, rows_per_pass: int | None = None) -> int:
    """How many passes of at most rows_per_pass (ROWS_PER_PASS) rows take `rows` rows."""
    return max(1, -(-rows // (rows_per_pass or ROWS_PER_PASS)))


def _in_parallel(work: Callable[[int], Any], passes: int) -> Iterator[Any]:
    """work(0), ..., work(passes - 1), in order, computed on up to MAX_WORKERS
    threads (the kernels release the GIL: ctypes calls); the first error raised."""
    workers = max(1, min(passes, os.cpu_count() or 1, MAX_WORKERS))
    if workers == 1:
        try:
            yield from (work(i) for i in range(passes))
        finally:
            release_scratch()
        return
    # A worker takes the next pass as soon as its own is done, not when the oldest
    # pass in flight is (passes differ in size: waiting for the oldest left a core
    # idle for a sixth of the clock's passes at 1 M ops). Finished passes wait in
    # `done` to be yielded in order; at most `workers` are computing at a time.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        running = {pool.submit(work, i): i for i in range(workers)}
        done: dict[int, Any] = {}
        submitted, yielded = workers, 0
        while yielded < passes:
            while yielded not in done:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    done[running.pop(future)] = future.result()
                    if submitted < passes:
                        running[pool.submit(work, submitted)] = submitted
                        submitted += 1
            yield done.pop(yielded)
            yielded += 1


def usable_kept(run: Any, release: bool = False) -> CollectiveColumns | None:
    """The collective columns the native reader kept, when they number all the run's
    collective ops by op_groups (every collective came through the native reader;
    op_groups counts its rows as they were parsed, where they are held outside the
    table, and the other readers' rows in the table) and the kernels exist;
    release=True drops them from the run (the last use)."""
    kept = run.meta.pop("collectives_kept", None) if release else run.meta.get("collectives_kept")
    if kept is None or library() is None:
        return None
    return kept if groups.collective_ops(run) == kept.rows else None


@dataclass
class JobTables:
    """What rwa_prepare reads besides the rows: strings in their sorted order,
    members, and each host's clock."""

    strings: list[str]  # every kept string, sorted (codes below index this)
    func_rank: np.ndarray  # job-wide string code -> sorted code
    members: np.ndarray  # [n_members][MEMBER_COLUMNS]
    hosts: list[str]  # sorted; the members' host codes index this
    clock_ok: np.ndarray
    offset_ns: np.ndarray
    drift_ppm: np.ndarray
    t0_ns: np.ndarray
    bound_ns: np.ndarray
    bound_ok: np.ndarray  # set only with clock_ok: a bound is a column of a clock row
    worlds: list[int]


def _unique_rows(con: Any, sql: str, width: int) -> dict[tuple, tuple]:
    """Rows of `sql` keyed by their first `width` columns; Declined when a key
    repeats (a join on it would repeat ops, which the kernels do not)."""
    out: dict[tuple, tuple] = {}
    for row in con.execute(sql).fetchall():
        key = tuple(row[:width])
        if key in out:
            raise Declined(f"{sql}: key {key} repeats")
        out[key] = tuple(row[width:])
    return out


def job_tables(
    con: Any, kept: CollectiveColumns, clocks: bool = True, ranks: bool = True
) -> JobTables:
    """The kept columns' dictionaries and members resolved against host_clock and
    rank_map, as OPS_ALIGNED_SQL joins them; with clocks=False every host's clock
    is the identity (rwa_prepare then gives raw host times, as clock.py reads them);
    with ranks=False no member has a world rank (rank_map need not exist yet: the
    clock's observations read none). Both False: `con` is not used."""
    strings = kept.strings
    by_text = sorted(range(len(strings)), key=strings.__getitem__)
    rank = np.empty(len(strings), dtype=np.int64)
    rank[by_text] = np.arange(len(strings))
    hosts = sorted({strings[m[4]] for m in kept.members})
    host_code = {h: i for i, h in enumerate(hosts)}
    by_host = (
        _unique_rows(con, "SELECT host, offset_ns, drift_ppm, t0_ns, bound_ns FROM host_clock", 1)
        if clocks
        else {(h,): (0.0, 0.0, 0, None) for h in hosts}
    )
    mapped = (
        _unique_rows(con, "SELECT comm_key, rank, host, pid, world_rank FROM rank_map", 4)
        if ranks
        else {}
    )
    worlds = sorted({w for (w,) in mapped.values() if w is not None})
    world_code = {w: i for i, w in enumerate(worlds)}
    members = np.zeros((len(kept.members), len(MEMBER_COLUMNS)), dtype=np.int64)
    for m, (cid, cname, r, n_ranks, host, pid, key) in enumerate(kept.members):
        comm_key = strings[key] if key >= 0 else None
        world = mapped.get((comm_key, r, strings[host], pid), (None,))[0]
        members[m] = (
            rank[key] if key >= 0 else -1,
            rank[cid],
            rank[cname] if cname >= 0 else -1,
            r,
            n_ranks or 0,
            n_ranks is not None,
            host_code[strings[host]],
            world or 0,
            world is not None,
            world_code[world] if world is not None else len(worlds),
        )
    shape = len(hosts)
    tables = JobTables(
        [strings[i] for i in by_text], rank, members, hosts,
        np.zeros(shape, np.uint8), np.zeros(shape), np.zeros(shape), np.zeros(shape, np.int64),
        np.zeros(shape), np.zeros(shape, np.uint8), worlds,
    )  # fmt: skip
    for i, host in enumerate(hosts):
        offset, drift, t0, bound = by_host.get((host,), (None, None, None, None))
        if offset is None or drift is None or t0 is None:
            continue  # no clock: corrected times NULL, as the LEFT JOIN gives
        tables.clock_ok[i] = 1
        tables.offset_ns[i], tables.drift_ppm[i], tables.t0_ns[i] = offset, drift, t0
        if bound is not None:
            tables.bound_ns[i], tables.bound_ok[i] = bound, 1
    return tables


# ------------------------------------------------------------------ a pass


@dataclass
class PassRows:
    """One pass's rows as rwa_prepare writes them."""

    comm: np.ndarray
    func: np.ndarray
    seq: np.ndarray
    seq_ok: np.ndarray
    data: np.ndarray  # [n][IN_COLUMNS]: a row's member as an index into job.members
    ok: np.ndarray

    @classmethod
    def empty(cls, rows: int) -> PassRows:
        """Uninitialised rows, in this thread's scratch (store.slabs.scratch)."""
        width = len(IN_COLUMNS)
        return cls(
            scratch("comm", rows, np.int64), scratch("func", rows, np.int64),
            scratch("seq", rows, np.int64), scratch("seq_ok", rows, np.uint8),
            scratch("data", rows * width, np.int64).reshape(rows, width),
            scratch("ok", rows * width, np.uint8).reshape(rows, width),
        )  # fmt: skip


@dataclass
class Grouping:
    """rwa_group's result for one pass, kept from the clock's passes for the
    collectives' (the same rows, keys and order: grouping them again took 0.05 CPU s
    at 1 M ops); `keys` tells the job tables it was made with."""

    keys: bytes
    groups: int
    first: np.ndarray
    order: np.ndarray  # int32: a pass has fewer than 2**31 rows
    starts: np.ndarray

    @staticmethod
    def keys_of(job: JobTables) -> bytes:
        """What rwa_prepare's group keys depend on besides the rows: each member's
        communicator code and the functions' order."""
        comm_key = job.members[:, MEMBER_COLUMNS.index("comm_key")]
        return comm_key.tobytes() + b"/" + job.func_rank.tobytes()


@dataclass
class Partition:
    """The kept rows of each pass: pass i's are sel[starts[i]:starts[i + 1]]."""

    sel: np.ndarray  # int32 row numbers, pass after pass
    starts: np.ndarray
    groupings: dict[int, Grouping] = field(default_factory=dict)  # by pass, until used

    @classmethod
    def of(cls, lib: ctypes.CDLL, kept: CollectiveColumns, passes: int) -> Partition:
        """kept's rows cut into `passes` passes by seq range (made once per number of
        passes, kept with the columns)."""
        made = kept.partitions.get(passes)
        if made is None:
            made = kept.partitions[passes] = cls._cut(lib, kept, passes)
        return made

    @classmethod
    def _cut(cls, lib: ctypes.CDLL, kept: CollectiveColumns, passes: int) -> Partition:
        sel, starts = np.empty(kept.rows, np.int32), np.empty(passes + 1, np.int64)
        buckets = np.empty(min(PARTITION_BUCKETS, max(2, kept.rows)), np.int64)
        got = lib.rwa_partition(
            kept.rows, _p(kept.seq), passes, len(buckets), _p(buckets), _p(sel), _p(starts)
        )
        if got < 0:
            raise Declined(f"rwa_partition declined {kept.rows} rows")
        return cls(sel, starts)

    def rows(self, i: int) -> np.ndarray:
        return self.sel[self.starts[i] : self.starts[i + 1]]


def _prepare(lib: ctypes.CDLL, kept: CollectiveColumns, job: JobTables, sel: np.ndarray
             ) -> PassRows:  # fmt: skip
    rows = len(sel)
    out = PassRows.empty(rows)
    v = kept.values
    got = lib.rwa_prepare(
        kept.rows, _p(kept.member), _p(kept.func), _p(kept.seq), _p(v["msg_bytes"]),
        _p(v["arrival_ns"]), _p(v["gpu_start_ns"]), _p(v["gpu_end_ns"]),
        _p(v["clock_error_ns"]), _p(kept.valid),
        len(job.members), _p(job.members), len(job.func_rank), _p(job.func_rank),
        len(job.hosts), _p(job.clock_ok), _p(job.offset_ns), _p(job.drift_ppm), _p(job.t0_ns),
        rows, _p(sel), rows, _p(out.comm), _p(out.func), _p(out.seq), _p(out.seq_ok),
        _p(out.data), _p(out.ok),
    )  # fmt: skip
    if got != rows:
        raise Declined(f"rwa_prepare returned {got} for {rows} rows")
    return out


def _group(lib: ctypes.CDLL, rows: PassRows) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    n = len(rows.seq)
    cap = 1 << max(1, int(2 * n - 1).bit_length())
    table = scratch("table", cap, np.int64)
    first, group = scratch("first", n, np.int64), scratch("group", n, np.int64)
    order, starts = scratch("order", n, np.int64), scratch("starts", n + 1, np.int64)
    got = lib.rwa_group(n, _p(rows.comm), _p(rows.func), _p(rows.seq), _p(rows.seq_ok), cap,
                        _p(table), _p(first), _p(group), _p(order), _p(starts))  # fmt: skip
    if got < 0:
        raise Declined(f"rwa_group failed ({got})")
    return int(got), first[:got], order, starts[: got + 1]


def _keep_grouping(partition: Partition, i: int, job: JobTables, grouped: tuple) -> None:
    n_groups, first, order, starts = grouped
    partition.groupings[i] = Grouping(
        Grouping.keys_of(job), n_groups, first.copy(), order.astype(np.int32), starts.copy()
    )


def _grouping(lib: ctypes.CDLL, partition: Partition, i: int, rows: PassRows, job: JobTables
              ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Pass i's grouping: the one its clock pass kept (dropped once taken), else
    rwa_group's."""
    kept = partition.groupings.pop(i, None)
    if kept is None or kept.keys != Grouping.keys_of(job) or len(kept.order) != len(rows.seq):
        return _group(lib, rows)
    order = scratch("order", len(kept.order), np.int64)
    order[:] = kept.order
    return kept.groups, kept.first, order, kept.starts


def _one_pass(lib: ctypes.CDLL, rows: PassRows, job: JobTables, late: Lateness,
              grouped: tuple[int, np.ndarray, np.ndarray, np.ndarray]) -> Any:  # fmt: skip
    """The pass's `joined` rows as an Arrow table; its rows summed into `late`
    (the pass's own: passes run in parallel, and their sums are added in order)."""
    n_groups, first, order, starts = grouped
    biggest = int(np.diff(starts).max()) if n_groups else 0
    out_i = np.empty((len(OUT_I64), n_groups), dtype=np.int64)
    out_f = np.empty((len(OUT_F64), n_groups), dtype=np.float64)
    out_ok = np.empty((len(OUT_I64) + len(OUT_F64), n_groups), dtype=np.uint8)
    stamp = np.full(len(job.hosts), -1, dtype=np.int64)
    scratch = np.empty(max(1, biggest), dtype=np.int64)
    got = lib.rwa_collectives(
        n_groups, _p(starts), _p(order), len(rows.seq), _p(rows.data), _p(rows.ok),
        len(job.members), _p(job.members), len(job.hosts), _p(job.bound_ns), _p(job.bound_ok),
        len(job.worlds) + 1, _p(stamp), _p(scratch), _p(out_i), _p(out_f), _p(out_ok),
        _p(late.i64), _p(late.f64),
    )  # fmt: skip
    if got < 0:  # the pass's own sums (a fresh Lateness) are dropped with it
        raise Declined(f"rwa_collectives returned {got}")
    return _joined(first, rows, out_i, out_f, out_ok, job)


def collectives_from_kept(
    kept: CollectiveColumns, job: JobTables, passes: int, late: Lateness
) -> Iterator[Any]:
    """Each pass's `joined` rows (an Arrow table), its ops added to `late`;
    Declined (raised before anything of a later pass is yielded) when the library is
    missing or a kernel declines."""
    lib = _library()
    partition = Partition.of(lib, kept, passes)

    def one_pass(i: int) -> tuple[Any, Lateness]:
        rows = _prepare(lib, kept, job, partition.rows(i))
        own = Lateness(job.hosts, job.worlds)
        return _one_pass(lib, rows, job, own, _grouping(lib, partition, i, rows, job)), own

    for joined, own in _in_parallel(one_pass, passes):
        late.add(own)
        yield joined


# ------------------------------------------------------------------ arrow


def _strings(codes: np.ndarray, valid: np.ndarray, strings: list[str]) -> Any:
    """Codes of `strings` (valid where `valid`) as an Arrow dictionary array."""
    import pyarrow as pa

    indices = pa.array(codes.astype(np.int32), mask=~valid, type=pa.int32())
    return pa.DictionaryArray.from_arrays(indices, pa.array(strings, type=pa.string()))


def _joined(first: np.ndarray, rows: PassRows, out_i: np.ndarray, out_f: np.ndarray,
            out_ok: np.ndarray, job: JobTables) -> Any:  # fmt: skip
    """The `joined` rows as an Arrow table (types cast to the SQL form's by the caller)."""
    import pyarrow as pa

    valid = out_ok.astype(bool)
    cols: dict[str, Any] = {}
    key_comm, key_func = rows.comm[first], rows.func[first]
    cols["comm_key"] = _strings(key_comm, key_comm >= 0, job.strings)
    cols["func"] = _strings(key_func, key_func >= 0, job.strings)
    cols["seq"] = pa.array(rows.seq[first], mask=rows.seq_ok[first] == 0)
    strings = {"last_host": job.hosts, "comm_id": job.strings, "comm_name": job.strings}
    for k, name in enumerate(OUT_I64):
        if name in strings:
            cols[name] = _strings(out_i[k], valid[k], strings[name])
        else:
            values = out_i[k].astype(bool) if name == "size_mismatch" else out_i[k]
            cols[name] = pa.array(values, mask=~valid[k])
    for k, name in enumerate(OUT_F64):
        cols[name] = pa.array(out_f[k], mask=~valid[len(OUT_I64) + k])
    return pa.table(cols)


# ---------------------------------------------------------------- host clocks

OBS_FIELDS = ("id", "host", "min_end", "max_start", "max_start_ok", "mean_end", "err")
OBS_SCRATCH = 7  # rwalign.h: RWA_OBS_SCRATCH, per-host accumulators of rwa_clock_obs
MAX_CELLS = 1 << 24  # (host pair, time bucket) cells beyond this: the SQL form instead
PAIRS_RANGE, PAIRS_COUNT, PAIRS_FILL, PAIRS_DETREND = range(4)  # rwalign.h: RWA_PAIRS_*


@dataclass
class ClockObservations:
    """OBS_SQL's rows: per (collective, host) of a communicator spanning several
    hosts; `host` codes index `hosts` (sorted)."""

    hosts: list[str]
    arrays: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return len(self.arrays["id"])


def _multi(job: JobTables) -> np.ndarray:
    """Per string code: whether it is a communicator key whose ops span several hosts."""
    hosts: dict[int, set[int]] = {}
    key, host = MEMBER_COLUMNS.index("comm_key"), MEMBER_COLUMNS.index("host")
    for row in job.members.tolist():
        hosts.setdefault(row[key], set()).add(row[host])
    multi = np.zeros(max(1, len(job.strings)), dtype=np.uint8)
    for code, seen in hosts.items():
        if code >= 0 and len(seen) > 1:
            multi[code] = 1
    return multi


def clock_observations(kept: CollectiveColumns, job: JobTables, t0_ns: int,
                       passes: int) -> ClockObservations:  # fmt: skip
    """OBS_SQL from the kept columns (job made with clocks=False: raw host times);
    Declined when the library is missing or a kernel declines."""
    lib = _library()
    multi = _multi(job)
    n_hosts = len(job.hosts)
    partition = Partition.of(lib, kept, passes)

    def one_pass(i: int) -> dict[str, np.ndarray]:
        sel = partition.rows(i)
        size = len(sel)
        rows = _prepare(lib, kept, job, sel)
        grouped = _group(lib, rows)
        _keep_grouping(partition, i, job, grouped)
        n_groups, _, order, starts = grouped
        scratch = np.zeros(OBS_SCRATCH * n_hosts, dtype=np.int64)
        scratch[:n_hosts] = -1
        sums = np.zeros(n_hosts)
        out = {
            "id": np.empty(size, np.int64), "host": np.empty(size, np.int64),
            "min_end": np.empty(size), "max_start": np.empty(size),
            "max_start_ok": np.empty(size, np.uint8), "mean_end": np.empty(size),
            "err": np.empty(size),
        }  # fmt: skip
        got = lib.rwa_clock_obs(
            n_groups, _p(starts), _p(order), len(rows.seq), _p(rows.data), _p(rows.ok),
            len(job.members), _p(job.members), _p(rows.comm), len(multi), _p(multi), n_hosts,
            _p(scratch), _p(sums), t0_ns, i << PASS_ID_BITS, size,
            *(_p(out[name]) for name in OBS_FIELDS),
        )  # fmt: skip
        if got < 0:
            raise Declined(f"rwa_clock_obs returned {got}")
        return {name: a[:got].copy() for name, a in out.items()}

    parts = list(_in_parallel(one_pass, passes))  # ids increase pass after pass
    arrays = {name: np.concatenate([p[name] for p in parts]) for name in OBS_FIELDS}
    return ClockObservations(job.hosts, arrays)


def medians(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """PERCENTILE_CONT(0.5) of each segment values[offsets[s]:offsets[s + 1]] as
    DuckDB computes it (NaN for an empty one); reorders `values` in place."""
    lib = _library()
    out = np.empty(len(offsets) - 1)
    got = lib.rwa_medians(len(out), _p(offsets), _p(values), _p(out))
    if got < 0:
        raise Declined(f"rwa_medians returned {got}")
    return out


class ClockPairs:
    """PAIRS_SQL's rows, never materialized: each (pair, time bucket) cell's
    differences `d` in one array, cell after cell, for BUCKET_SQL's medians, then
    the detrended differences in the same places for DETRENDED_SQL's.

    The observations are cut in two at a collective's boundary and each kernel
    call runs on both halves at once (rwa_clock_pairs never pairs observations of
    two collectives): each cell's values are the first half's, then the second's,
    as one call over all would place them. At 10 M op records these calls took
    0.45 s on one core while the other waited."""

    def __init__(self, obs: ClockObservations, pairs: list[tuple[str, str]], width: float):
        lib = _library()
        self._lib, self._obs, self._width = lib, obs, width
        code = {h: i for i, h in enumerate(obs.hosts)}
        self.pairs = [p for p in pairs if p[0] in code and p[1] in code]
        n = len(obs.hosts)
        self._pair_of = np.full(n * n, -1, dtype=np.int64)
        for k, (a, b) in enumerate(self.pairs):
            self._pair_of[code[a] * n + code[b]] = k
        self._halves = _halves(obs.arrays["id"])

        def span(half: int) -> np.ndarray:
            found = np.zeros(3, dtype=np.int64)  # least and greatest bucket, pairs
            self._call(half, PAIRS_RANGE, 0, 0, range_=found)
            return found

        seen = [found for found in self._each(span) if found[2]]
        self._lo = int(min(found[0] for found in seen)) if seen else 0
        self._buckets = int(max(found[1] for found in seen)) - self._lo + 1 if seen else 0
        cells = len(self.pairs) * self._buckets
        if cells > MAX_CELLS:
            raise Declined(f"{cells} clock cells")

        def count(half: int) -> np.ndarray:
            counts = np.zeros(cells, np.int64)
            self._call(half, PAIRS_COUNT, self._lo, self._buckets, cell_next=counts)
            return counts

        self._counts = self._each(count)
        self.counts = np.sum(self._counts, axis=0, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.values = np.empty(int(self.offsets[-1]))

        def fill(half: int) -> np.ndarray:
            t_sum = np.zeros(cells)
            self._call(half, PAIRS_FILL, self._lo, self._buckets, cell_next=self._starts(half),
                       values=self.values, t_sum=t_sum)  # fmt: skip
            return t_sum

        self.t_sum = np.sum(self._each(fill), axis=0)

    def _each(self, work: Callable[[int], Any]) -> list[Any]:
        """work(half) for each half, at once (the kernels release the GIL)."""
        return list(_in_parallel(work, len(self._halves)))

    def _starts(self, half: int) -> np.ndarray:
        """Where each cell's values from `half` go: after the earlier halves'."""
        starts = self.offsets[:-1].copy()
        for earlier in self._counts[:half]:
            starts += earlier
        return starts

    def _call(self, half: int, mode: int, lo: int, buckets: int, **arrays: np.ndarray) -> None:
        """rwa_clock_pairs over one half of the observations, filling `arrays`."""
        first, stop = self._halves[half]
        o = {name: a[first:stop] for name, a in self._obs.arrays.items()}
        none = np.zeros(1)
        a = {k: arrays.get(k, none) for k in ("cell_next", "values", "t_sum", "slope",
             "slope_err", "upper", "upper_ok", "lower", "lower_ok", "range_")}  # fmt: skip
        got = self._lib.rwa_clock_pairs(
            mode, stop - first, *(_p(o[name]) for name in OBS_FIELDS),
            len(self._obs.hosts), _p(self._pair_of), len(self.pairs), self._width, lo, buckets,
            *(_p(a[k]) for k in a),
        )  # fmt: skip
        if got < 0:
            raise Declined(f"rwa_clock_pairs({mode}) returned {got}")

    def _medians(self, offsets: np.ndarray) -> np.ndarray:
        """medians() of the segments of self.values at `offsets`, in as many parts
        at once as there are halves."""
        n = len(offsets) - 1
        cuts = np.linspace(0, n, len(self._halves) + 1).astype(np.int64)
        parts = self._each(lambda k: medians(offsets[cuts[k] : cuts[k + 1] + 1], self.values))
        return np.concatenate(parts)

    def bucket_rows(self) -> list[tuple]:
        """BUCKET_SQL's rows: (ha, hb, bucket, mean t, median d, count)."""
        middle = self._medians(self.offsets)
        rows = []
        for cell in np.flatnonzero(self.counts).tolist():
            pair, bucket = divmod(cell, self._buckets)
            n = int(self.counts[cell])
            rows.append((*self.pairs[pair], float(self._lo + bucket), self.t_sum[cell] / n,
                         float(middle[cell]), n))  # fmt: skip
        return rows

    def detrended_rows(self, slope: dict[str, float], slope_err: dict[tuple[str, str], float]
                       ) -> list[tuple]:  # fmt: skip
        """DETRENDED_SQL's rows: (ha, hb, count, upper bound, lower bound, point)."""
        n_pairs = len(self.pairs)
        slopes = np.array([slope.get(h, 0.0) for h in self._obs.hosts])
        errs = np.array([slope_err.get(p, 0.0) for p in self.pairs])

        def detrend(half: int) -> tuple[np.ndarray, ...]:
            bounds = (np.zeros(n_pairs), np.zeros(n_pairs, np.uint8), np.zeros(n_pairs),
                      np.zeros(n_pairs, np.uint8))  # fmt: skip
            self._call(half, PAIRS_DETREND, self._lo, self._buckets,
                       cell_next=self._starts(half), values=self.values, slope=slopes,
                       slope_err=errs, upper=bounds[0], upper_ok=bounds[1], lower=bounds[2],
                       lower_ok=bounds[3])  # fmt: skip
            return bounds

        upper, upper_ok, lower, lower_ok = _tightest(self._each(detrend))
        bounds = np.ascontiguousarray(self.offsets[:: max(1, self._buckets)])  # pair by pair
        points = self._medians(bounds) if self._buckets else np.empty(0)
        rows = []
        for k, pair in enumerate(self.pairs):
            n = int(bounds[k + 1] - bounds[k]) if self._buckets else 0
            if n == 0 or pair not in slope_err:
                continue
            rows.append((*pair, n, float(upper[k]) if upper_ok[k] else None,
                         float(lower[k]) if lower_ok[k] else None, float(points[k])))  # fmt: skip
        return rows


HALF_OBSERVATIONS = 100_000  # fewer observations than twice this: one call, no thread


def _halves(ids: np.ndarray) -> list[tuple[int, int]]:
    """The observations (ids non-decreasing) as one range, or two that split no
    collective."""
    n = len(ids)
    if n < 2 * HALF_OBSERVATIONS:
        return [(0, n)]
    cut = int(np.searchsorted(ids, ids[n // 2], side="left"))
    if cut == 0:
        cut = int(np.searchsorted(ids, ids[n // 2], side="right"))
    return [(0, cut), (cut, n)] if 0 < cut < n else [(0, n)]


def _tightest(halves: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """The halves' pair bounds combined: the least upper and greatest lower bound
    each half found (a bound is known where any half knows it)."""
    upper, upper_ok, lower, lower_ok = (a.copy() for a in halves[0])
    for u, u_ok, lo, lo_ok in halves[1:]:
        take = (u_ok == 1) & ((upper_ok == 0) | (u < upper))
        upper[take], upper_ok[take] = u[take], 1
        take = (lo_ok == 1) & ((lower_ok == 0) | (lo > lower))
        lower[take], lower_ok[take] = lo[take], 1
    return upper, upper_ok, lower, lower_ok
