"""What `rankwatch analyze` reports about an aligned run, as plain data.

`summarize(run, clock)` returns one JSON-ready dict: job, ranks,
communicators, ops per function, clock, late ranks, p2p, findings (empty until
detectors exist) and problems. Rendering it is the caller's business.
"""

from __future__ import annotations

from typing import Any

from rankwatch.align import groups
from rankwatch.align.clock import ClockEstimate
from rankwatch.model import Run

LATE_RANKS = 5


def _rows(run: Run, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cursor = run.con.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _scalar(run: Run, sql: str) -> Any:
    return run.con.execute(sql).fetchall()[0][0]


def job_summary(run: Run) -> dict[str, Any]:
    counted = groups.table(run)
    span = run.con.execute(
        f"SELECT min(first_arrival_ns), max(last_end_ns) FROM {counted}"
    ).fetchall()[0]
    state = {
        t: _scalar(run, f"SELECT count(*) FROM {t}")
        for t in ("comms", "progress", "clock", "stats")
    }
    jobs = [
        r[0]
        for r in run.con.execute(
            f"SELECT job_id FROM {counted} WHERE job_id IS NOT NULL UNION "
            "SELECT job_id FROM comms WHERE job_id IS NOT NULL ORDER BY 1"
        ).fetchall()
    ]
    world = _rows(
        run,
        "SELECT comm_key AS key, comm_id AS id, comm_name AS name, n_ranks, "
        "nnodes FROM communicators WHERE comm_key = ?",
        [run.meta.get("world_comm")],
    )
    return {
        "job_ids": jobs,
        "ranks": _scalar(run, "SELECT count(*) FROM processes"),
        "processes": _scalar(
            run, "SELECT count(*) FROM (SELECT DISTINCT host, pid FROM processes) AS p"
        ),
        "hosts": _scalar(run, "SELECT count(DISTINCT host) FROM processes"),
        "op_records": _scalar(run, f"SELECT coalesce(sum(ops), 0) FROM {counted}"),
        "state_records": state,
        "files": _scalar(run, "SELECT count(*) FROM files"),
        "formats": dict(
            run.con.execute(
                f"SELECT source_format, sum(ops) FROM {counted} GROUP BY 1 ORDER BY 1"
            ).fetchall()
        ),
        "time_span_s": None if span[0] is None else (span[1] - span[0]) / 1e9,
        "world_comm": world[0] if world else None,
    }


def communicators(run: Run) -> list[dict[str, Any]]:
    comms = _rows(
        run,
        "SELECT comm_key AS key, comm_id AS id, comm_name AS name, n_ranks, "
        "nnodes, hosts, processes, ops FROM communicators "
        "ORDER BY n_ranks DESC, name, key",
    )
    funcs: dict[str, dict[str, int]] = {}
    for key, func, n in run.con.execute(
        f"SELECT comm_key, func, sum(ops) FROM {groups.table(run)} GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall():
        funcs.setdefault(key, {})[func] = int(n)
    bw = dict(
        run.con.execute(
            "SELECT comm_key, PERCENTILE_CONT(0.5) WITHIN GROUP "
            "(ORDER BY busbw_gbs) FROM collectives GROUP BY 1"
        ).fetchall()
    )
    for c in comms:
        c["ops_per_func"] = funcs.get(c["key"], {})
        c["median_busbw_gbs"] = bw.get(c["key"])
    return comms


def ranks(run: Run) -> list[dict[str, Any]]:
    counted = groups.table(run)
    return _rows(
        run,
        f"""
        SELECT p.world_rank, p.host, p.pid, p.device, p.in_world_comm,
               coalesce(o.ops, 0) AS ops, l.times_last_arrival, l.arrival_lag_caused_ns,
               l.mean_last_arrival_lag_ns, l.times_last_gpu_start, l.gpu_lag_caused_ns,
               l.mean_last_gpu_lag_ns, l.significant_last_arrivals,
               l.significant_last_gpu_starts, l.max_lag_bound_ns
        FROM processes p
        LEFT JOIN (
            SELECT m.world_rank, sum(n.ops) AS ops
            FROM (SELECT comm_key, rank, host, pid, sum(ops) AS ops FROM {counted}
                  GROUP BY 1, 2, 3, 4) n
            JOIN rank_map m ON m.comm_key = n.comm_key AND m.rank = n.rank
                AND m.host = n.host AND m.pid = n.pid
            GROUP BY m.world_rank
        ) o ON o.world_rank = p.world_rank
        LEFT JOIN rank_lateness l ON l.world_rank = p.world_rank
        ORDER BY p.world_rank""",
    )


def late_ranks(rank_rows: list[dict[str, Any]], limit: int = LATE_RANKS) -> list[dict[str, Any]]:
    """Ranks that caused the most lag (by API call or GPU start), worst first."""

    def caused(r: dict[str, Any]) -> float:
        return max(r.get("arrival_lag_caused_ns") or 0, r.get("gpu_lag_caused_ns") or 0)

    return sorted((r for r in rank_rows if caused(r) > 0), key=caused, reverse=True)[:limit]


def clock_summary(clock: ClockEstimate) -> dict[str, Any]:
    return {
        "reference": clock.reference,
        "t0_ns": clock.t0_ns,
        "consistent": clock.consistent,
        "notes": list(clock.notes),
        "max_bound_ns": clock.max_bound_ns,
        "hosts": [
            {
                "host": h.host,
                "offset_ns": h.offset_ns,
                "drift_ppm": h.drift_ppm,
                "bound_ns": h.bound_ns,
                "method": h.method,
                "pairs": h.pairs,
                "constraints": h.constraints,
            }
            for h in clock.hosts
        ],
    }


def summarize(run: Run, clock: ClockEstimate) -> dict[str, Any]:
    rank_rows = ranks(run)
    ops_per_func = dict(
        run.con.execute(
            f"SELECT func, sum(ops) FROM {groups.table(run)} GROUP BY 1 ORDER BY 2 DESC, 1"
        ).fetchall()
    )
    return {
        "job": job_summary(run),
        "ranks": rank_rows,
        "communicators": communicators(run),
        "ops_per_func": ops_per_func,
        "clock": clock_summary(clock),
        "late_ranks": late_ranks(rank_rows),
        "p2p": {
            "pairs": _scalar(run, "SELECT count(*) FROM p2p_pairs"),
            "unmatched": run.meta.get("p2p_unmatched", 0),
        },
        "findings": [],
        "problems": [p.to_dict() for p in run.problems],
        "skipped_files": run.meta.get("skipped", []),
    }
