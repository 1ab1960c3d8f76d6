"""Point-to-point ops matched across ranks: a Send on one rank with the Recv on
its peer, by (communicator, sender, receiver, per-pair order `seq`).

p2p_pairs: one row per matched pair with both sides' arrival and GPU times,
which side came late and by how much (lag_bound_ns as in collectives), and the
transfer time: the overlap of the two GPU spans when clocks are trusted, else
the shorter of the two durations. Unmatched ops (peer's record missing) are
counted in run.meta["p2p_unmatched"].
"""

from __future__ import annotations

from rankwatch.align import groups
from rankwatch.align.collectives import aligned_sql
from rankwatch.model import Run
from rankwatch.store.p2p_rows import KEPT_P2P

# The P2P ops, with only what the two queries below read, in one scan of ops (a
# view over rows that each scan converts or reads back from disk: store.held), or
# of the P2P rows the native reader kept as it parsed and the others' (`kept`).
P2P_COLUMNS = (
    "func, comm_key, comm_name, rank, peer, seq, world_rank, host, msg_bytes, arrival_c, "
    "gpu_start_c, gpu_end_c, gpu_start_ns, gpu_end_ns, clock_bound_ns"
)
P2P_OPS_SQL = f"""
CREATE OR REPLACE TEMP TABLE p2p_ops AS
SELECT {P2P_COLUMNS} FROM ops_aligned WHERE kind = 'p2p'
"""
KEPT_VIEW = "rankwatch_kept_p2p"
# what aligned_sql reads of a P2P row
KEPT_COLUMNS = (
    "func, comm_key, comm_name, rank, peer, seq, host, pid, msg_bytes, arrival_ns, "
    "gpu_start_ns, gpu_end_ns, kind"
)

P2P_PAIRS_SQL = """
CREATE OR REPLACE TABLE p2p_pairs AS
WITH p AS (SELECT * FROM p2p_ops),
     s AS (SELECT * FROM p WHERE func = 'Send'),
     r AS (SELECT * FROM p WHERE func = 'Recv')
SELECT s.comm_key, max(s.comm_name) OVER (PARTITION BY s.comm_key) AS comm_name,
       s.rank AS sender, r.rank AS receiver, s.seq,
       s.world_rank AS sender_world_rank, r.world_rank AS receiver_world_rank,
       s.msg_bytes, s.arrival_c AS send_arrival, r.arrival_c AS recv_arrival,
       s.gpu_start_c AS send_gpu_start, r.gpu_start_c AS recv_gpu_start,
       s.gpu_end_c AS send_gpu_end, r.gpu_end_c AS recv_gpu_end,
       CASE WHEN s.arrival_c > r.arrival_c THEN 'sender' ELSE 'receiver' END AS late_side,
       abs(s.arrival_c - r.arrival_c) AS arrival_gap_ns,
       CASE WHEN s.host = r.host THEN 0.0 ELSE s.clock_bound_ns + r.clock_bound_ns END
           AS lag_bound_ns,
       CASE WHEN s.host = r.host OR (s.clock_bound_ns + r.clock_bound_ns) * 10
                 <= least(s.gpu_end_c, r.gpu_end_c) - greatest(s.gpu_start_c, r.gpu_start_c)
            THEN least(s.gpu_end_c, r.gpu_end_c) - greatest(s.gpu_start_c, r.gpu_start_c)
            ELSE least(s.gpu_end_ns - s.gpu_start_ns, r.gpu_end_ns - r.gpu_start_ns)
       END AS transfer_ns
FROM s JOIN r ON s.comm_key = r.comm_key AND s.peer = r.rank AND r.peer = s.rank
    AND s.seq = r.seq
"""

UNMATCHED_SQL = """
WITH p AS (SELECT comm_key, rank, peer, seq, func FROM p2p_ops)
SELECT count(*) FROM p o
WHERE NOT EXISTS (
    SELECT 1 FROM p q
    WHERE q.comm_key = o.comm_key AND q.rank = o.peer AND q.peer = o.rank
      AND q.seq = o.seq AND q.func <> o.func)
"""


def _p2p_ops(run: Run) -> None:
    """p2p_ops: from the rows the native reader kept (store.p2p_rows) and the P2P rows
    the other readers appended, where it kept them; else from ops."""
    kept = run.meta.pop(KEPT_P2P, None)
    if kept is None:
        run.con.execute(P2P_OPS_SQL)
        return
    run.con.register(KEPT_VIEW, kept.table)
    try:
        source = (
            f"(SELECT {KEPT_COLUMNS} FROM {KEPT_VIEW} UNION ALL "
            f"SELECT {KEPT_COLUMNS} FROM {kept.rest} WHERE kind = 'p2p')"
        )
        run.con.execute(aligned_sql("p2p_aligned", source, temp=True))
        run.con.execute(
            f"CREATE OR REPLACE TEMP TABLE p2p_ops AS SELECT {P2P_COLUMNS} FROM p2p_aligned"
        )
    finally:  # nothing left reading the registered view
        run.con.execute("DROP VIEW IF EXISTS p2p_aligned")
        run.con.unregister(KEPT_VIEW)


# The columns and types of P2P_PAIRS_SQL's table, for a job without P2P ops: its
# table is made empty without the five statements (20 ms) that would find no pair.
# Spelled out rather than asked of DuckDB (a DESCRIBE binds the ops view);
# tests/analysis/test_align.py checks them against the table the SQL makes.
P2P_PAIRS_TYPES = (
    ("comm_key", "VARCHAR"), ("comm_name", "VARCHAR"), ("sender", "INTEGER"),
    ("receiver", "INTEGER"), ("seq", "BIGINT"), ("sender_world_rank", "BIGINT"),
    ("receiver_world_rank", "BIGINT"), ("msg_bytes", "BIGINT"), ("send_arrival", "BIGINT"),
    ("recv_arrival", "BIGINT"), ("send_gpu_start", "BIGINT"), ("recv_gpu_start", "BIGINT"),
    ("send_gpu_end", "BIGINT"), ("recv_gpu_end", "BIGINT"), ("late_side", "VARCHAR"),
    ("arrival_gap_ns", "BIGINT"), ("lag_bound_ns", "DOUBLE"), ("transfer_ns", "BIGINT"),
)  # fmt: skip


def _has_p2p(run: Run) -> bool:
    """Whether the run has any P2P op (op_groups counts every op by kind)."""
    sql = f"SELECT count(*) FROM {groups.table(run)} WHERE kind = 'p2p' AND ops > 0"
    return bool(run.con.execute(sql).fetchall()[0][0])


def align_p2p(run: Run) -> None:
    if not _has_p2p(run):
        run.meta.pop(KEPT_P2P, None)
        columns = ", ".join(f'"{name}" {sql_type}' for name, sql_type in P2P_PAIRS_TYPES)
        run.con.execute(f"CREATE OR REPLACE TABLE p2p_pairs ({columns})")
        run.tables["p2p_pairs"] = "p2p_pairs"
        run.meta["p2p_unmatched"] = 0
        return
    _p2p_ops(run)
    try:
        run.con.execute(P2P_PAIRS_SQL)
        run.tables["p2p_pairs"] = "p2p_pairs"
        run.meta["p2p_unmatched"] = int(run.con.execute(UNMATCHED_SQL).fetchall()[0][0])
    finally:
        run.con.execute("DROP TABLE IF EXISTS p2p_ops")
