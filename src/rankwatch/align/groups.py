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
from rankwatch.store.grouped import KEPT_GROUPS

TABLE = "op_groups"
KEYS = "comm_key, rank, host, pid, device, func, kind, source_format, job_id"
KEPT_VIEW = "rankwatch_kept_groups"


def count_sql(source: str) -> str:
    """op_groups's rows over the op rows of `source`."""
    return f"""
SELECT {KEYS},
       count(*) AS ops, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
       max(n_ranks) AS n_ranks, max(nnodes) AS nnodes,
       min(arrival_ns) AS first_arrival_ns,
       max(coalesce(gpu_end_ns, enqueue_end_ns, arrival_ns)) AS last_end_ns,
       min(gpu_start_ns) FILTER (WHERE gpu_end_ns IS NOT NULL) AS first_timed_start_ns,
       max(gpu_end_ns) FILTER (WHERE gpu_start_ns IS NOT NULL) AS last_timed_end_ns
FROM {source}
GROUP BY {KEYS}"""


def merge_sql(parts: list[str]) -> str:
    """op_groups's rows from partial counts of the same columns in the same order
    (count_sql's output over parts of the ops): counts add up, extremes combine."""
    union = " UNION ALL ".join(f"({p})" for p in parts)
    return f"""
SELECT {KEYS},
       CAST(sum(ops) AS BIGINT) AS ops, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
       max(n_ranks) AS n_ranks, max(nnodes) AS nnodes,
       min(first_arrival_ns) AS first_arrival_ns, max(last_end_ns) AS last_end_ns,
       min(first_timed_start_ns) AS first_timed_start_ns,
       max(last_timed_end_ns) AS last_timed_end_ns
FROM ({union})
GROUP BY {KEYS}"""


def make(run: Run) -> str:
    """(Re)count `ops` into op_groups; its name. Call it again whenever ops changed.
    The first time, the counts the native reader kept as it parsed (store.grouped)
    stand in for a scan of its rows."""
    kept = run.meta.pop(KEPT_GROUPS, None)
    if kept is None:
        run.con.execute(f"CREATE OR REPLACE TABLE {TABLE} AS {count_sql('ops')}")
        release_arrow_memory()  # the first full scan of ops: see there
    else:
        run.con.register(KEPT_VIEW, kept.table)
        try:
            parts = [f"SELECT * FROM {KEPT_VIEW}", count_sql(kept.rest)]
            run.con.execute(f"CREATE OR REPLACE TABLE {TABLE} AS {merge_sql(parts)}")
        finally:
            run.con.unregister(KEPT_VIEW)
    run.tables[TABLE] = TABLE
    return TABLE


def table(run: Run) -> str:
    """op_groups, made now if this run has none yet."""
    return TABLE if TABLE in run.tables else make(run)


def collective_ops(run: Run) -> int:
    """How many collective ops the run has."""
    sql = f"SELECT coalesce(sum(ops), 0) FROM {table(run)} WHERE kind = 'coll'"
    return int(run.con.execute(sql).fetchall()[0][0])
