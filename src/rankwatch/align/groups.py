"""`op_groups`: the ops counted once per (communicator, rank, process, device,
function, kind, format, job), with the few extremes the summary needs.

Every scan of `ops` reads a million rows per million records (0.01 to 0.07 s
each, more for the op rows held as Arrow batches: rankwatch.store.held), and
who-is-who (ranks.py), the clock's host list and span (clock.py), the row counts
the compiled alignment checks (kernels.py, collectives.py) and the summary
(summary.py) asked eleven such questions of it. They read this table instead: a
few rows per rank, made by one scan (align.map_ranks makes it; `table()` makes
it where nothing has yet, e.g. a clock estimate over trace rows).
"""

from __future__ import annotations

from rankwatch.model import Run
from rankwatch.store.engine import release_arrow_memory

TABLE = "op_groups"

OP_GROUPS_SQL = f"""
CREATE OR REPLACE TABLE {TABLE} AS
SELECT comm_key, rank, host, pid, device, func, kind, source_format, job_id,
       count(*) AS ops, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
       max(n_ranks) AS n_ranks, max(nnodes) AS nnodes,
       min(arrival_ns) AS first_arrival_ns,
       max(coalesce(gpu_end_ns, enqueue_end_ns, arrival_ns)) AS last_end_ns,
       min(gpu_start_ns) FILTER (WHERE gpu_end_ns IS NOT NULL) AS first_timed_start_ns,
       max(gpu_end_ns) FILTER (WHERE gpu_start_ns IS NOT NULL) AS last_timed_end_ns
FROM ops
GROUP BY comm_key, rank, host, pid, device, func, kind, source_format, job_id
"""


def make(run: Run) -> str:
    """(Re)count `ops` into op_groups; its name. Call it again whenever ops changed."""
    run.con.execute(OP_GROUPS_SQL)
    release_arrow_memory()  # the first full scan of ops: see there
    run.tables[TABLE] = TABLE
    return TABLE


def table(run: Run) -> str:
    """op_groups, made now if this run has none yet."""
    return TABLE if TABLE in run.tables else make(run)


def collective_ops(run: Run) -> int:
    """How many collective ops the run has."""
    sql = f"SELECT coalesce(sum(ops), 0) FROM {table(run)} WHERE kind = 'coll'"
    return int(run.con.execute(sql).fetchall()[0][0])
