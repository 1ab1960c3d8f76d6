"""Records of an aligned Run as a stream of numpy batches, in the order a live
monitor would receive them: ops by (corrected) GPU end, progress records by
time, merged so each window holds the progress written up to its last op.

Strings never reach Python per record: communicators, processes and functions
are turned into integers by SQL joins against small temp tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rankwatch.detect.columns import NF, REASONS, STATES, OpColumns, ProgressColumns
from rankwatch.detect.robust import nanmax
from rankwatch.detect.topology import COLL_FUNCS, Topology, func_case_sql
from rankwatch.model import Run
from rankwatch.store.load import insert_tuples

BATCH = 65536
TAIL_WINDOW_NS = 250e6  # progress-only windows after the last op


def _register(run: Run, topo: Topology) -> None:
    con = run.con
    con.execute(
        "CREATE OR REPLACE TEMP TABLE rw_det_procs (world_rank BIGINT, host VARCHAR, "
        "pid BIGINT, first_of_process BOOLEAN, proc BIGINT)"
    )
    first = topo.proc_of_key  # (host, pid): the process's first rank
    procs = [
        (p.world_rank, p.host, p.pid, first[(p.host, p.pid)] == i, i)
        for i, p in enumerate(topo.procs)
    ]
    insert_tuples(con, "rw_det_procs", ["world_rank", "host", "pid", "first_of_process", "proc"],
                  procs)  # fmt: skip
    con.execute("CREATE OR REPLACE TEMP TABLE rw_det_comms (comm_key VARCHAR, comm BIGINT)")
    comms = [(c.key, i) for i, c in enumerate(topo.comms)]
    insert_tuples(con, "rw_det_comms", ["comm_key", "comm"], comms)


def _rel(col: str, t0: int) -> str:
    return f"CAST({col} - {int(t0)} AS DOUBLE)"


def ops_sql(t0: int) -> str:
    # An incomplete op (written before NCCL reported all its channels) still
    # counts in the communicator's order of ops (desync), but its GPU times do not.
    # Stream order is by GPU end, but never before the op was issued: NCCL has
    # reported CUDA-graph replays that end before their launch, and placing one
    # there would count it ahead of ops issued before it.
    gpu = "CASE WHEN coalesce(o.complete, true) THEN {} END"
    times = ", ".join(
        f"{_rel(c, t0)} AS {a}"
        for c, a in (
            ("o.arrival_ns", "arrival"),
            (gpu.format("o.gpu_start_ns"), "gstart"),
            (gpu.format("o.gpu_end_ns"), "gend"),
            ("o.arrival_c", "arrival_c"),
            (gpu.format("o.gpu_start_c"), "gstart_c"),
            (gpu.format("o.gpu_end_c"), "gend_c"),
        )
    )
    return f"""
SELECT p.proc, c.comm, o.rank, {func_case_sql("o.func")} AS func, coalesce(o.seq, -1) AS seq,
       coalesce(o.peer, -1) AS peer, coalesce(o.msg_bytes, -1) AS msg,
       coalesce(o.root, -1) AS root, {times}
FROM ops_aligned o
JOIN rw_det_procs p ON p.world_rank = o.world_rank
JOIN rw_det_comms c ON c.comm_key = o.comm_key
WHERE o.kind IN ('coll', 'p2p') AND o.seq IS NOT NULL
ORDER BY greatest(coalesce(o.gpu_end_c, o.arrival_c), o.arrival_c), p.proc
"""


def progress_sql(t0: int) -> str:
    # A progress record's rank is found through its communicator and rank in that
    # communicator (rank_map), which also tells apart the ranks of a process that
    # holds several; one that no other record names goes to its process's first rank.
    per_func = ", ".join(
        f"coalesce(map_extract(g.colls, '{f}')[1].{k}, -1) AS {k}_{i}"
        for k in ("enqueued", "started", "completed")
        for i, f in enumerate(COLL_FUNCS)
    )
    states = " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(STATES))
    reasons = " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(REASONS))
    shift = (
        "coalesce(CAST(round(h.offset_ns + h.drift_ppm * 1e-6 * CAST(g.ts_ns - h.t0_ns AS DOUBLE))"
        " AS BIGINT), 0)"
    )
    return f"""
SELECT p.proc, c.comm, g.rank, {_rel(f"g.ts_ns - {shift}", t0)} AS ts,
       CASE g.reason {reasons} ELSE -1 END AS reason, {per_func},
       coalesce(g.p2p.send_enqueued, 0) AS se, coalesce(g.p2p.send_completed, 0) AS sc,
       coalesce(g.p2p.recv_enqueued, 0) AS re, coalesce(g.p2p.recv_completed, 0) AS rc,
       coalesce(g.in_flight_count, 0) AS in_flight,
       {func_case_sql("g.in_flight[1].func")} AS if_func,
       coalesce(g.in_flight[1].seq, -1) AS if_seq, coalesce(g.in_flight[1].peer, -1) AS if_peer,
       CASE g.in_flight[1].state {states} ELSE -1 END AS if_state,
       {_rel(f"g.in_flight[1].arrival_ns - {shift}", t0)} AS if_arrival,
       CAST(g.in_flight[1].age_ns AS DOUBLE) AS if_age
FROM progress g
JOIN rw_det_comms c ON c.comm_key = '0x' || left(ltrim(lower(substr(g.comm_id, 3)), '0'), 14)
LEFT JOIN rank_map m ON m.comm_key = c.comm_key AND m.rank = g.rank AND m.host = g.host
    AND m.pid = g.pid
LEFT JOIN (SELECT host, pid, world_rank FROM rw_det_procs WHERE first_of_process) AS f
    ON f.host = g.host AND f.pid = g.pid
JOIN rw_det_procs p ON p.world_rank = coalesce(m.world_rank, f.world_rank)
LEFT JOIN host_clock h ON h.host = g.host
ORDER BY ts, p.proc
"""


def _numpy(batch) -> dict[str, np.ndarray]:  # noqa: ANN001 - a pyarrow RecordBatch
    out = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if col.null_count and col.type.bit_width == 64 and str(col.type) == "double":
            arr = col.fill_null(np.nan).to_numpy(zero_copy_only=False)
        else:
            arr = col.to_numpy(zero_copy_only=False)
        if arr.dtype == object:
            arr = np.array([np.nan if v is None else v for v in arr], dtype=float)
        out[name] = arr
    return out


def _reader(run: Run, sql: str, batch: int):
    """Arrow record batches of a query (DuckDB 2 renamed record_batch)."""
    rel = run.con.sql(sql)
    if hasattr(rel, "to_arrow_reader"):
        return rel.to_arrow_reader(batch)
    return rel.record_batch(batch)


def _fill_float(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def read_ops(
    run: Run, topo: Topology, batch: int = BATCH, register: bool = True
) -> Iterator[OpColumns]:
    """register=False: the topology's id tables are already in the connection (a live
    monitor reads many batches with one topology)."""
    if register:
        _register(run, topo)
    reader = _reader(run, ops_sql(topo.t0_ns), batch)
    for rb in reader:
        cols = _numpy(rb)
        for k in ("arrival", "gstart", "gend", "arrival_c", "gstart_c", "gend_c"):
            cols[k] = _fill_float(cols[k])
        yield OpColumns.from_arrays(cols)


def read_progress(run: Run, topo: Topology, register: bool = True) -> ProgressColumns:
    if register:
        _register(run, topo)
    c = _numpy_all(run, progress_sql(topo.t0_ns))
    n = len(c["proc"])

    def mat(kind: str) -> np.ndarray:
        return (
            np.stack([c[f"{kind}_{i}"] for i in range(NF)], axis=1).astype(np.int64).reshape(n, NF)
        )

    return ProgressColumns(
        proc=c["proc"].astype(np.int64),
        comm=c["comm"].astype(np.int64),
        rank=c["rank"].astype(np.int64),
        ts=_fill_float(c["ts"]),
        reason=c["reason"].astype(np.int64),
        enq=mat("enqueued"),
        start=mat("started"),
        done=mat("completed"),
        p2p=np.stack([c["se"], c["sc"], c["re"], c["rc"]], axis=1).astype(np.int64).reshape(n, 4),
        in_flight=c["in_flight"].astype(np.int64),
        if_func=c["if_func"].astype(np.int64),
        if_seq=c["if_seq"].astype(np.int64),
        if_peer=c["if_peer"].astype(np.int64),
        if_state=c["if_state"].astype(np.int64),
        if_arrival=_fill_float(c["if_arrival"]),
        if_age=_fill_float(c["if_age"]),
    )


def _numpy_all(run: Run, sql: str) -> dict[str, np.ndarray]:
    cols = run.con.execute(sql).fetchnumpy()
    out = {}
    for name, arr in cols.items():
        if isinstance(arr, np.ma.MaskedArray):
            arr = arr.astype(float).filled(np.nan) if arr.dtype.kind == "f" else arr.filled(-1)
        out[name] = np.asarray(arr)
    return out


def windows(
    run: Run, topo: Topology, batch: int = BATCH
) -> Iterator[tuple[OpColumns | None, ProgressColumns | None, float]]:
    """(ops, progress, now) windows in stream order; see module doc."""
    prog = read_progress(run, topo)
    i = 0
    now = -np.inf
    for ops in read_ops(run, topo, batch, register=False):  # read_progress registered them
        end = np.where(np.isnan(ops.gend_c), ops.arrival_c, ops.gend_c)
        now = max(now, nanmax(end))
        j = int(np.searchsorted(prog.ts, now, side="right"))
        yield ops, (prog.take(np.arange(i, j)) if j > i else None), now
        i = j
    while i < len(prog):
        now = max(now, float(prog.ts[i])) + TAIL_WINDOW_NS
        j = int(np.searchsorted(prog.ts, now, side="right"))
        yield None, prog.take(np.arange(i, j)), now
        i = j
