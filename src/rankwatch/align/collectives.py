"""Collectives matched across ranks by (communicator, function, sequence number).

Tables and views this creates (all times on the reference clock, see clock.py):

ops_aligned (view)  every op with its world rank and corrected times
                    (arrival_c, gpu_start_c, gpu_end_c) and clock_bound_ns, the
                    uncertainty of its host's clock against the reference.
collectives         one row per collective instance: first/last/median arrival,
                    the last arriver (by API call and by GPU start), transfer time
                    and bus bandwidth, and lag_bound_ns: how uncertain a comparison
                    of two ranks' times in this op is (the sum of the two largest
                    host clock bounds involved; 0 on one host).
collective_ranks    (view) one row per rank per collective: its wait on the last
                    arriver, its lag behind the median, whether it was last and, if
                    so, the lag it caused (its lead over the second-to-last).
rank_lateness       per world rank: how often it was last (by API call and by GPU
                    start), the total and mean lag it caused, and how many of
                    those lags exceed the clock uncertainty.

Transfer time: `end_minus_last_start` = min over ranks of gpu_end - max over ranks
of gpu_start (the time the data moved once everyone had started) when host clocks
are trusted for this op (one host, or the lag bound is below a tenth of it);
otherwise `min_duration` = the shortest gpu_end - gpu_start of any rank, which is
clock-free (the last starter does not wait) but includes its own launch jitter.
Bus bandwidth uses the nccl-tests factors: AllReduce 2(n-1)/n; AllGather and
ReduceScatter (n-1)/n with traffic msg x n; others 1.

Two forms compute collectives and rank_lateness: the SQL below, and compiled
kernels (kernels.py) over the collective columns the native reader kept while
parsing, which give the same rows (tests/analysis/test_align_kernels.py) for
about a third of the CPU time. The kernels run when those columns are exactly
the ops table's collective rows; the SQL everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwatch.align import groups, kernels
from rankwatch.align.clock import correction_sql
from rankwatch.model import Run
from rankwatch.store import background


def aligned_sql(view: str, source: str, temp: bool = False) -> str:
    """A view (temporary: `temp`) of the op rows of `source` with their world rank,
    clock-corrected times and clock bound."""
    return f"""
CREATE OR REPLACE {"TEMP " if temp else ""}VIEW {view} AS
SELECT o.*, m.world_rank,
       {correction_sql("o.arrival_ns")} AS arrival_c,
       {correction_sql("o.gpu_start_ns")} AS gpu_start_c,
       {correction_sql("o.gpu_end_ns")} AS gpu_end_c,
       c.bound_ns AS clock_bound_ns
FROM {source} o
LEFT JOIN host_clock c ON c.host = o.host
LEFT JOIN rank_map m ON m.comm_key = o.comm_key AND m.rank = o.rank AND m.host = o.host
    AND m.pid = o.pid
"""


OPS_ALIGNED_SQL = aligned_sql("ops_aligned", "ops")

# The rows of collectives, with corrected times. A view, read twice below, so that
# nothing of the size of the ops table is materialized (a common table expression
# read twice would be, and spill at tens of millions of ops).
COLLECTIVE_OPS_SQL = """
CREATE OR REPLACE TEMP VIEW collective_ops AS
SELECT comm_key, func, seq, n_ranks, host, msg_bytes, rank, world_rank,
       arrival_c, gpu_start_c, gpu_end_c, gpu_end_ns - gpu_start_ns AS duration, clock_bound_ns
FROM ops_aligned WHERE kind = 'coll'
"""

# One aggregation per collective (names and host counts straight from ops, times
# from collective_ops), then one more pass for what depends on the group's
# maximum: the last arriver is the smallest rank at the latest arrival (the smallest
# rank of all when no arrival is known), the second-to-last arrival is that same
# time when several ranks share it, else the latest earlier one; likewise for GPU
# starts and for the two largest clock bounds. Same results as ordering each
# collective's ranks with window functions, at a fraction of the cost.
#
# {part} selects the collectives of one pass: the medians keep every value of a
# collective in memory until its group is done, and aggregation states do not
# spill, so large jobs are aligned in several passes over disjoint sets of
# sequence numbers (align_collectives), each bounded in memory.
JOINED_CTES = """
WITH agg AS (
    SELECT comm_key, func, seq,
        max(n_ranks) AS n_ranks, count(*) AS n_seen, max(msg_bytes) AS msg_bytes,
        min(msg_bytes) <> max(msg_bytes) AS size_mismatch,
        min(arrival_c) AS first_arrival, max(arrival_c) AS last_arrival,
        PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY arrival_c) AS median_arrival,
        min(gpu_start_c) AS first_gpu_start, max(gpu_start_c) AS last_gpu_start,
        PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY gpu_start_c) AS median_gpu_start,
        min(gpu_end_c) AS first_gpu_end, max(gpu_end_c) AS last_gpu_end,
        min(gpu_end_c) - max(gpu_start_c) AS end_minus_last_start,
        min(duration) AS min_duration,
        count(*) FILTER (WHERE clock_bound_ns IS NULL) AS unbounded,
        max(clock_bound_ns) AS top_bound
    FROM collective_ops WHERE {part} GROUP BY comm_key, func, seq
), names AS (
    SELECT comm_key, func, seq, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
           count(host) AS hosts
    FROM (SELECT comm_key, func, seq, host, max(comm_id) AS comm_id,
                 max(comm_name) AS comm_name
          FROM ops WHERE kind = 'coll' AND {part} GROUP BY comm_key, func, seq, host) AS per_host
    GROUP BY comm_key, func, seq
), tops AS (
    SELECT r.comm_key, r.func, r.seq,
        min(r.rank) FILTER (WHERE r.arrival_c = a.last_arrival OR a.last_arrival IS NULL)
            AS last_rank,
        arg_min(r.world_rank, r.rank)
            FILTER (WHERE r.arrival_c = a.last_arrival OR a.last_arrival IS NULL)
            AS last_world_rank,
        arg_min(r.host, r.rank)
            FILTER (WHERE r.arrival_c = a.last_arrival OR a.last_arrival IS NULL) AS last_host,
        count(*) FILTER (WHERE r.arrival_c = a.last_arrival) AS at_last_arrival,
        max(r.arrival_c) FILTER (WHERE r.arrival_c < a.last_arrival) AS before_last_arrival,
        arg_min(r.world_rank, r.rank)
            FILTER (WHERE r.gpu_start_c = a.last_gpu_start OR a.last_gpu_start IS NULL)
            AS last_gpu_world_rank,
        count(*) FILTER (WHERE r.gpu_start_c = a.last_gpu_start) AS at_last_gpu_start,
        max(r.gpu_start_c) FILTER (WHERE r.gpu_start_c < a.last_gpu_start)
            AS before_last_gpu_start,
        count(*) FILTER (WHERE r.clock_bound_ns = a.top_bound) AS at_top_bound,
        max(r.clock_bound_ns) FILTER (WHERE r.clock_bound_ns < a.top_bound) AS below_top_bound
    FROM (SELECT * FROM collective_ops WHERE {part}) AS r
    JOIN agg a ON r.comm_key IS NOT DISTINCT FROM a.comm_key
        AND r.func IS NOT DISTINCT FROM a.func AND r.seq IS NOT DISTINCT FROM a.seq
    GROUP BY r.comm_key, r.func, r.seq
), joined AS (
    SELECT a.comm_key, a.func, a.seq, nm.comm_id, nm.comm_name, a.n_ranks, a.n_seen, nm.hosts,
        a.msg_bytes, a.size_mismatch, a.first_arrival, a.last_arrival,
        CASE WHEN p.at_last_arrival >= 2 THEN a.last_arrival ELSE p.before_last_arrival END
            AS second_last_arrival,
        a.median_arrival, p.last_rank, p.last_world_rank, p.last_host,
        a.first_gpu_start, a.last_gpu_start,
        CASE WHEN p.at_last_gpu_start >= 2 THEN a.last_gpu_start ELSE p.before_last_gpu_start END
            AS second_last_gpu_start,
        a.median_gpu_start, p.last_gpu_world_rank, a.first_gpu_end, a.last_gpu_end,
        a.end_minus_last_start, a.min_duration,
        CASE WHEN nm.hosts = 1 THEN 0.0
             WHEN a.unbounded > 0 THEN NULL
             ELSE a.top_bound + CASE WHEN p.at_top_bound >= 2 THEN a.top_bound
                                     ELSE coalesce(p.below_top_bound, 0.0) END
        END AS lag_bound_ns
    FROM agg a JOIN tops p ON a.comm_key IS NOT DISTINCT FROM p.comm_key
        AND a.func IS NOT DISTINCT FROM p.func AND a.seq IS NOT DISTINCT FROM p.seq
    JOIN names nm ON a.comm_key IS NOT DISTINCT FROM nm.comm_key
        AND a.func IS NOT DISTINCT FROM nm.func AND a.seq IS NOT DISTINCT FROM nm.seq
)"""

# What follows the `joined` rows: the transfer time and the bandwidth. The SQL
# form reads `joined` from JOINED_CTES, the compiled one (kernels.py) from the rows
# its kernels computed.
TAIL = """, t AS (
    SELECT *,
        CASE WHEN end_minus_last_start > 0 AND lag_bound_ns IS NOT NULL
                  AND lag_bound_ns * 10 <= end_minus_last_start
             THEN 'end_minus_last_start' ELSE 'min_duration' END AS transfer_method
    FROM joined
), b AS (
    SELECT *,
        CASE WHEN transfer_method = 'end_minus_last_start' THEN end_minus_last_start
             ELSE min_duration END AS transfer_ns,
        CASE WHEN func IN ('AllGather', 'ReduceScatter') THEN msg_bytes * n_ranks
             ELSE msg_bytes END AS traffic_bytes,
        CASE WHEN func = 'AllReduce' THEN 2.0 * (n_ranks - 1) / n_ranks
             WHEN func IN ('AllGather', 'ReduceScatter') THEN (n_ranks - 1.0) / n_ranks
             ELSE 1.0 END AS bus_factor,
        last_arrival - second_last_arrival AS last_lag_ns,
        last_gpu_start - second_last_gpu_start AS last_gpu_lag_ns,
        last_arrival - median_arrival AS last_vs_median_ns,
        last_gpu_start - median_gpu_start AS last_gpu_vs_median_ns
    FROM t
)
SELECT *,
    CASE WHEN transfer_ns > 0 THEN traffic_bytes / transfer_ns END AS algbw_gbs,
    CASE WHEN transfer_ns > 0 THEN traffic_bytes / transfer_ns * bus_factor END AS busbw_gbs,
    lag_bound_ns IS NOT NULL AND last_lag_ns > lag_bound_ns AS lag_significant,
    lag_bound_ns IS NOT NULL AND last_gpu_lag_ns > lag_bound_ns AS gpu_lag_significant
FROM b
"""
COLLECTIVES_QUERY = JOINED_CTES + TAIL

COLLECTIVES_SQL = "CREATE OR REPLACE TABLE collectives AS" + COLLECTIVES_QUERY.format(part="TRUE")
# Rows of collective ops aligned in one pass (about 300 bytes of memory each; the
# compiled form's passes: kernels.ROWS_PER_PASS).
ROWS_PER_PASS = 2_500_000

COLLECTIVE_RANKS_SQL = """
CREATE OR REPLACE VIEW collective_ranks AS
SELECT o.comm_key, o.func, o.seq, o.rank, o.world_rank, o.host, o.pid,
       o.arrival_c, o.gpu_start_c, o.gpu_end_c,
       c.last_arrival - o.arrival_c AS wait_ns,
       c.last_gpu_start - o.gpu_start_c AS gpu_wait_ns,
       o.arrival_c - c.median_arrival AS arrival_lag_ns,
       o.gpu_start_c - c.median_gpu_start AS gpu_lag_ns,
       o.arrival_c = c.last_arrival AS is_last_arrival,
       o.gpu_start_c = c.last_gpu_start AS is_last_gpu_start,
       CASE WHEN o.arrival_c = c.last_arrival THEN c.last_lag_ns END AS lag_caused_ns,
       CASE WHEN o.gpu_start_c = c.last_gpu_start THEN c.last_gpu_lag_ns END AS gpu_lag_caused_ns,
       c.lag_bound_ns, c.n_seen
FROM ops_aligned o
JOIN collectives c ON c.comm_key = o.comm_key AND c.func = o.func AND c.seq = o.seq
WHERE o.kind = 'coll'
"""

RANK_LATENESS_QUERY = """
SELECT world_rank, min(host) AS host,
       count(*) AS collectives,
       count(*) FILTER (WHERE is_last_arrival AND n_seen > 1) AS times_last_arrival,
       coalesce(sum(lag_caused_ns) FILTER (WHERE n_seen > 1), 0) AS arrival_lag_caused_ns,
       avg(lag_caused_ns) FILTER (WHERE n_seen > 1) AS mean_last_arrival_lag_ns,
       count(*) FILTER (WHERE is_last_gpu_start AND n_seen > 1) AS times_last_gpu_start,
       coalesce(sum(gpu_lag_caused_ns) FILTER (WHERE n_seen > 1), 0) AS gpu_lag_caused_ns,
       avg(gpu_lag_caused_ns) FILTER (WHERE n_seen > 1) AS mean_last_gpu_lag_ns,
       avg(arrival_lag_ns) AS mean_arrival_lag_ns,
       avg(gpu_lag_ns) AS mean_gpu_lag_ns,
       max(lag_bound_ns) AS max_lag_bound_ns,
       count(*) FILTER (WHERE n_seen > 1 AND lag_bound_ns IS NOT NULL
                        AND lag_caused_ns > lag_bound_ns) AS significant_last_arrivals,
       count(*) FILTER (WHERE n_seen > 1 AND lag_bound_ns IS NOT NULL
                        AND gpu_lag_caused_ns > lag_bound_ns) AS significant_last_gpu_starts
FROM collective_ranks
GROUP BY world_rank
"""
RANK_LATENESS_SQL = "CREATE OR REPLACE TABLE rank_lateness AS" + RANK_LATENESS_QUERY


def _part(i: int, passes: int) -> str:
    """The collectives of pass i of `passes`: every one in exactly one pass,
    whatever its seq (null, negative)."""
    if passes == 1:
        return "TRUE"
    return f"coalesce((seq % {passes} + {passes}) % {passes}, 0) = {i}"


def _collectives(run: Run) -> None:
    """Create collectives with SQL, in one pass or, for large jobs, several (see
    COLLECTIVES_QUERY)."""
    passes = kernels.passes(groups.collective_ops(run), ROWS_PER_PASS)
    for i in range(passes):
        target = "INSERT INTO collectives" if i else "CREATE OR REPLACE TABLE collectives AS"
        run.con.execute(target + COLLECTIVES_QUERY.format(part=_part(i, passes)))


# The columns and types of the SQL forms' `joined` rows (JOINED_CTES) and of
# RANK_LATENESS_QUERY, which the compiled form's Arrow tables are cast to. Spelled
# out rather than asked of DuckDB (a DESCRIBE binds the ops view: 20 ms a run);
# tests/analysis/test_align_kernels.py checks them against DESCRIBE.
JOINED_TYPES = (
    ("comm_key", "VARCHAR"), ("func", "VARCHAR"), ("seq", "BIGINT"), ("comm_id", "VARCHAR"),
    ("comm_name", "VARCHAR"), ("n_ranks", "INTEGER"), ("n_seen", "BIGINT"),
    ("hosts", "BIGINT"), ("msg_bytes", "BIGINT"), ("size_mismatch", "BOOLEAN"),
    ("first_arrival", "BIGINT"), ("last_arrival", "BIGINT"),
    ("second_last_arrival", "BIGINT"), ("median_arrival", "DOUBLE"),
    ("last_rank", "INTEGER"), ("last_world_rank", "BIGINT"), ("last_host", "VARCHAR"),
    ("first_gpu_start", "BIGINT"), ("last_gpu_start", "BIGINT"),
    ("second_last_gpu_start", "BIGINT"), ("median_gpu_start", "DOUBLE"),
    ("last_gpu_world_rank", "BIGINT"), ("first_gpu_end", "BIGINT"),
    ("last_gpu_end", "BIGINT"), ("end_minus_last_start", "BIGINT"),
    ("min_duration", "BIGINT"), ("lag_bound_ns", "DOUBLE"),
)  # fmt: skip
RANK_LATENESS_TYPES = (
    ("world_rank", "BIGINT"), ("host", "VARCHAR"), ("collectives", "BIGINT"),
    ("times_last_arrival", "BIGINT"), ("arrival_lag_caused_ns", "HUGEINT"),
    ("mean_last_arrival_lag_ns", "DOUBLE"), ("times_last_gpu_start", "BIGINT"),
    ("gpu_lag_caused_ns", "HUGEINT"), ("mean_last_gpu_lag_ns", "DOUBLE"),
    ("mean_arrival_lag_ns", "DOUBLE"), ("mean_gpu_lag_ns", "DOUBLE"),
    ("max_lag_bound_ns", "DOUBLE"), ("significant_last_arrivals", "BIGINT"),
    ("significant_last_gpu_starts", "BIGINT"),
)  # fmt: skip


def _cast_select(types: tuple[tuple[str, str], ...]) -> str:
    """SELECT list giving these column names and types."""
    return ", ".join(f'CAST("{name}" AS {sql_type}) AS "{name}"' for name, sql_type in types)


# The compiled form's results being computed (_start_native): a call that waits for
# the `joined` rows (an Arrow table) and the rank lateness sums, None when a kernel
# declined; or None where the kernels do not apply. The SQL form runs in either case.
Aligning = Callable[[], "tuple[Any, kernels.Lateness] | None"] | None


def _start_native(run: Run) -> Aligning:
    """Start the compiled kernels (kernels.py) over the kept columns, in passes as
    the SQL form, on threads of their own (nothing is created until
    finish_collectives)."""
    import pyarrow as pa

    kept = kernels.usable_kept(run, release=True)
    if kept is None:
        return None
    try:
        job = kernels.job_tables(run.con, kept)
    except kernels.Declined:
        return None
    late = kernels.Lateness(job.hosts, job.worlds)
    passes = kernels.passes(kept.rows)

    def compute() -> tuple[Any, kernels.Lateness] | None:
        try:
            # one row per collective, a few per thousand ops: the passes' rows are
            # joined and written in one statement (one per pass cost 25 to 60 ms each)
            return pa.concat_tables(kernels.collectives_from_kept(kept, job, passes, late)), late
        except kernels.Declined:
            return None

    return background.start(compute)


def _collectives_native(run: Run, joined: Any) -> None:
    """Create collectives from the kernels' `joined` rows."""
    con = run.con
    con.register("rankwatch_joined", joined)
    try:
        con.execute(
            "CREATE OR REPLACE TABLE collectives AS "
            f"WITH joined AS (SELECT {_cast_select(JOINED_TYPES)} FROM rankwatch_joined){TAIL}"
        )
    finally:
        con.unregister("rankwatch_joined")


def _rank_lateness_native(run: Run, late: kernels.Lateness) -> None:
    """rank_lateness from the kernels' sums, typed as RANK_LATENESS_SQL's columns."""
    import pyarrow as pa

    casts = _cast_select(RANK_LATENESS_TYPES)
    run.con.register("rankwatch_lateness", pa.table(late.rows()))
    try:
        run.con.execute(
            f"CREATE OR REPLACE TABLE rank_lateness AS SELECT {casts} FROM rankwatch_lateness"
        )
    finally:
        run.con.unregister("rankwatch_lateness")


def start_collectives(run: Run) -> Aligning:
    """Create ops_aligned (host_clock and rank_map made) and start the compiled
    kernels; finish_collectives makes the rest. Meanwhile the caller may run SQL that
    does not read what they make (align() aligns the P2P ops)."""
    run.con.execute(OPS_ALIGNED_SQL)
    run.con.execute(COLLECTIVE_OPS_SQL)  # internal: read by COLLECTIVES_QUERY only
    return _start_native(run)


def finish_collectives(run: Run, aligning: Aligning) -> None:
    """Create collectives, collective_ranks and rank_lateness: from the compiled
    kernels' results where they have some, else with SQL."""
    native = aligning() if aligning is not None else None
    late = None
    if native is not None:
        joined, late = native
        _collectives_native(run, joined)
    else:
        _collectives(run)
    run.tables["ops_aligned"] = "ops_aligned"
    run.tables["collectives"] = "collectives"
    run.con.execute(COLLECTIVE_RANKS_SQL)
    run.tables["collective_ranks"] = "collective_ranks"
    if late is None:
        run.con.execute(RANK_LATENESS_SQL)
    else:
        _rank_lateness_native(run, late)
    run.tables["rank_lateness"] = "rank_lateness"


def align_collectives(run: Run) -> None:
    """Create ops_aligned, collectives, collective_ranks and rank_lateness."""
    finish_collectives(run, start_collectives(run))
