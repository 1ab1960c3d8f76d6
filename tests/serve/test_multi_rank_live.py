"""The live monitor's job state when one process holds several ranks: a rank that
first shows up after the detectors started (here the records of one GPU of a
process held back during warm-up) makes the monitor rebuild its topology, as a new
process would, so that rank's ops are judged too; the per-process drop counters are
exported once per process, not once per rank."""

from __future__ import annotations

from pathlib import Path

import duckdb

from rankwatch.serve.convert import arrow_table
from rankwatch.serve.job import JobConfig, LiveJob
from rankwatch.simulate import SimConfig, SlowFault, simulate
from rankwatch.store import ingest

TIMES = {"ops": "arrival_ns", "comms": "ts_ns", "progress": "ts_ns", "clock": "ts_ns",
         "stats": "ts_ns"}  # fmt: skip
HOST, HELD = "sim-node000", 2


def _store(tmp: Path) -> duckdb.DuckDBPyConnection:
    cfg = SimConfig(ranks=8, hosts=2, tp=2, pp=2, steps=40, one_process_per_host=True,
                    slow=SlowFault(5, 20, "gpu", 3000))  # fmt: skip
    simulate(cfg, tmp / "job")
    ingest([tmp / "job"], store_path=str(tmp / "job.duckdb"), progress=False).con.close()
    return duckdb.connect(str(tmp / "job.duckdb"), read_only=True)


def _held(table: str) -> str:
    """Rows of GPU HELD of the first host's process."""
    if table in ("ops", "comms"):
        return f"(host = '{HOST}' AND device = {HELD})"
    if table in ("progress", "clock"):
        return (
            f"(host = '{HOST}' AND (comm_id, rank) IN (SELECT comm_id, rank FROM comms "
            f"WHERE host = '{HOST}' AND device = {HELD}))"
        )
    return "false"


def test_a_rank_of_a_known_process_that_appears_late_is_added(tmp_path: Path) -> None:
    src = _store(tmp_path)

    def batch(where) -> dict:  # noqa: ANN001 - a function of (table, time column)
        return {
            t: arrow_table(src.sql(f"SELECT * FROM {t} WHERE {where(t, ts)} ORDER BY {ts}"))
            for t, ts in TIMES.items()
        }

    lo, hi = src.execute("SELECT min(arrival_ns), max(arrival_ns) FROM ops").fetchall()[0]
    cut = lo + (hi - lo) * 0.3
    job = LiveJob("sim", "sim", JobConfig(max_warm_s=1.0, settle_s=0.5), 0.0)
    job.add(batch(lambda t, ts: f"{ts} < {cut} AND NOT {_held(t)}"), 0.0)
    job.tick(2.0)
    assert job.phase == "live" and job.topo is not None
    assert sorted(p.world_rank for p in job.topo.procs) == [0, 1, 3, 4, 5, 6, 7]
    job.add(batch(lambda t, ts: f"{ts} < {cut} AND {_held(t)}"), 2.1)
    assert job.rebuild_at is not None  # the process is known, its rank 2 is not
    for i in range(10):
        a, b = cut + (hi - cut) * i / 10, cut + (hi - cut) * (i + 1) / 10 + (i == 9)
        job.add(batch(lambda t, ts, a=a, b=b: f"{ts} >= {a} AND {ts} < {b}"), 3.0 + i)
        job.tick(3.5 + i)
    job.finish(100.0)
    assert job.rebuilds == 1
    assert sorted(p.world_rank for p in job.topo.procs) == list(range(8))
    assert [(f.kind, f.rank, f.cause) for f in job.findings()] == [("straggler", 5, "gpu")]
    rows = job.rank_rows()
    assert sorted(r for r, _, _, _ in rows) == list(range(8))
    firsts = sorted(r for r, _, _, first in rows if first)
    assert firsts == [0, 4]  # one per process: where its drop counters go
