"""Who is who: communicators, processes, and each process's rank in the job.

A rank's process is (host, pid), plus the CUDA device for a process that holds
several ranks of one communicator or uses several devices (a single-controller JAX
program, or one PyTorch process driving every GPU of a node): there each device is
a rank of its own, and the device is what ties a rank in one communicator to the same rank in
another. Such a process whose records lack the device (its CUDA runtime could
not tell) stays one row, with the smallest of its ranks. The `processes` table
has one row per job rank: host, pid, device (null unless the process holds
several ranks), multi_rank, world_rank. Its job-wide rank is its rank in the
world communicator, taken to be the communicator with the most ranks (ties: the
one seen from the most processes, then with the most ops). The `rank_map` table
gives every (communicator, rank) its process and world rank, which is also how
ranks of different communicators relate to each other, and how ops find their
rank: by (comm_key, rank, host, pid), whatever device their own record names.

Communicators are keyed by `comm_key` (the id cut to NCCL Inspector's 14 hex
digits, leading zeros dropped) so rankwatch and Inspector records join.
"""

from __future__ import annotations

from rankwatch.align import groups
from rankwatch.model import Run

# Processes and hosts per communicator are counted over (communicator, process)
# groups, which is much cheaper than counting distinct values over every op; the
# ops come counted already (op_groups, see groups.py).
COMMUNICATORS_SQL = """
CREATE OR REPLACE TABLE communicators AS
WITH members AS (
    SELECT comm_key, host, pid, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
           max(n_ranks) AS n_ranks, max(nnodes) AS nnodes, sum(ops) AS ops
    FROM op_groups GROUP BY comm_key, host, pid
), seen AS (
    SELECT comm_key, max(comm_id) AS comm_id, max(comm_name) AS comm_name,
           max(n_ranks) AS n_ranks, max(nnodes) AS nnodes,
           count(*) FILTER (WHERE host IS NOT NULL AND pid IS NOT NULL) AS processes,
           count(DISTINCT host) AS hosts, CAST(sum(ops) AS BIGINT) AS ops
    FROM members GROUP BY comm_key
), declared AS (
    SELECT '0x' || left(ltrim(lower(substr(comm_id, 3)), '0'), 14) AS comm_key,
           max(comm_id) AS comm_id, max(comm_name) AS comm_name, max(n_ranks) AS n_ranks,
           max(nnodes) AS nnodes,
           count(DISTINCT host || ':' || CAST(pid AS VARCHAR)) AS processes,
           count(DISTINCT host) AS hosts
    FROM comms GROUP BY 1
)
SELECT coalesce(s.comm_key, d.comm_key) AS comm_key,
       coalesce(d.comm_id, s.comm_id) AS comm_id,
       coalesce(s.comm_name, d.comm_name) AS comm_name,
       greatest(coalesce(s.n_ranks, 0), coalesce(d.n_ranks, 0)) AS n_ranks,
       coalesce(s.nnodes, d.nnodes) AS nnodes,
       greatest(coalesce(s.processes, 0), coalesce(d.processes, 0)) AS processes,
       greatest(coalesce(s.hosts, 0), coalesce(d.hosts, 0)) AS hosts,
       coalesce(s.ops, 0) AS ops
FROM seen s FULL OUTER JOIN declared d ON s.comm_key = d.comm_key
"""

# Every (communicator, rank) seen, once, with its process and device: the device
# any of its records names (op records and `comm` state records may differ: NCCL
# Inspector's records and a communicator whose CUDA device could not be read have
# none). The device is kept only for processes that hold several ranks (multi_rank:
# several ranks of one communicator, or several devices); -1 stands for "unknown"
# (a join key cannot be null).
MEMBERS_SQL = """
CREATE OR REPLACE TEMP TABLE comm_members AS
WITH seen AS (
    SELECT comm_key, rank, host, pid, max(device) AS device
    FROM (
        SELECT DISTINCT comm_key, rank, host, pid, device FROM op_groups
        UNION ALL
        SELECT '0x' || left(ltrim(lower(substr(comm_id, 3)), '0'), 14), rank, host, pid, device
        FROM comms
    ) AS records
    GROUP BY comm_key, rank, host, pid
), multi AS (
    SELECT DISTINCT host, pid FROM seen GROUP BY comm_key, host, pid
    HAVING count(DISTINCT rank) > 1
    UNION
    SELECT host, pid FROM seen GROUP BY host, pid HAVING count(DISTINCT device) > 1
)
SELECT s.comm_key, s.rank, s.host, s.pid,
       CASE WHEN m.pid IS NOT NULL THEN coalesce(s.device, -1) ELSE -1 END AS device,
       m.pid IS NOT NULL AS multi_rank
FROM seen s LEFT JOIN multi m ON m.host = s.host AND m.pid = s.pid
"""

PROCESSES_SQL = """
CREATE OR REPLACE TABLE processes AS
WITH procs AS (SELECT DISTINCT host, pid, device, multi_rank FROM comm_members),
world AS (
    SELECT host, pid, device, min(rank) AS rank FROM comm_members WHERE comm_key = ?
    GROUP BY host, pid, device
),
joined AS (
    SELECT p.host, p.pid, p.device, p.multi_rank, w.rank AS world_rank
    FROM procs p LEFT JOIN world w ON p.host = w.host AND p.pid = w.pid AND p.device = w.device
)
SELECT host, pid, CASE WHEN device >= 0 THEN device END AS device, multi_rank,
       coalesce(world_rank, (SELECT coalesce(max(rank), -1) FROM world)
                + row_number() OVER (PARTITION BY world_rank IS NULL ORDER BY host, pid, device))
           AS world_rank,
       world_rank IS NOT NULL AS in_world_comm
FROM joined
"""

RANK_MAP_SQL = """
CREATE OR REPLACE TABLE rank_map AS
SELECT m.comm_key, c.comm_id, c.comm_name, m.rank, m.host, m.pid, p.device, p.world_rank
FROM comm_members m
JOIN communicators c ON c.comm_key = m.comm_key
JOIN processes p ON p.host = m.host AND p.pid = m.pid AND coalesce(p.device, -1) = m.device
"""


def world_comm(run: Run) -> str | None:
    """comm_key of the world communicator (most ranks, then processes, then ops)."""
    rows = run.con.execute(
        "SELECT comm_key FROM communicators "
        "ORDER BY n_ranks DESC, processes DESC, ops DESC, comm_key LIMIT 1"
    ).fetchall()
    return rows[0][0] if rows else None


def map_ranks(run: Run, recount: bool = True) -> str | None:
    """Create communicators, processes and rank_map; returns the world comm_key.
    recount=False: op_groups as it is (made since ops last changed)."""
    con = run.con
    if recount:
        groups.make(run)
    else:
        groups.table(run)
    con.execute(COMMUNICATORS_SQL)
    con.execute(MEMBERS_SQL)
    world = world_comm(run)
    con.execute(PROCESSES_SQL, [world])
    con.execute(RANK_MAP_SQL)
    con.execute("DROP TABLE comm_members")
    for name in ("communicators", "processes", "rank_map"):
        run.tables[name] = name
    run.meta["world_comm"] = world
    return world
