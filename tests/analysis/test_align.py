"""rankwatch.align: ranks, collectives and P2P ops matched across processes."""

from __future__ import annotations

import statistics

import pytest
from analysis_support import inspector_coll, inspector_p2p, truth, write_lines

from rankwatch.align import align
from rankwatch.align.p2p import P2P_PAIRS_TYPES
from rankwatch.store import ingest


def aligned(directory):
    run = ingest([directory], progress=False).run()
    clock = align(run)
    return run, clock


def rows(run, sql: str, params=None) -> list[dict]:
    cursor = run.con.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def affected_collectives(run, fault: dict, first_op_only: bool = False) -> list[dict]:
    """Collectives on the comm a slow-rank fault hits first, from the fault's start on
    (only the first op of each step with first_op_only)."""
    first = fault["first_affected_op"]
    hit = rows(
        run,
        "SELECT * FROM collectives WHERE comm_id = ? AND func = ? AND seq >= ? ORDER BY seq",
        [first["comm_id"], first["func"], first["seq"]],
    )
    if first_op_only:
        step = first["seqs_per_step"]
        hit = [c for c in hit if c["seq"] % step == first["seq"] % step]
    return hit


def test_processes_map_to_their_rank_in_the_world_communicator(sim) -> None:
    # Given a 16-rank job with TP, PP and DP communicators
    directory = sim("plain")
    expected = {(r["host"], r["pid"]): r["rank"] for r in truth(directory)["ranks"]}
    # When aligned
    run, _ = aligned(directory)
    # Then every process has the world rank the simulation gave it
    got = {(r["host"], r["pid"]): r["world_rank"] for r in rows(run, "SELECT * FROM processes")}
    assert got == expected
    # And rank_map relates the ranks of every communicator through (host, pid)
    comms = truth(directory)["communicators"]
    tp0 = next(c for c in comms if c["name"] == "TP Group 0")
    mapped = rows(
        run, "SELECT rank, world_rank FROM rank_map WHERE comm_id = ? ORDER BY rank", [tp0["id"]]
    )
    assert [m["world_rank"] for m in mapped] == tp0["ranks"]


def test_a_late_host_is_the_last_arriver_with_the_injected_lateness(sim) -> None:
    # Given a job where rank 5's API calls come 3000 us late from step 40 on
    directory = sim("slow_host")
    fault = truth(directory)["faults"][0]
    # When aligned
    run, _ = aligned(directory)
    hit = affected_collectives(run, fault)
    # Then rank 5 arrives last at the collectives it is late for, by about 3000 us
    last = [c["last_world_rank"] for c in hit]
    assert last.count(fault["rank"]) >= 0.95 * len(hit)
    lag = statistics.median(c["last_vs_median_ns"] for c in hit if c["last_world_rank"] == 5)
    assert lag == pytest.approx(fault["slow_us"] * 1e3, rel=0.1)
    assert all(c["lag_significant"] for c in hit if c["last_world_rank"] == 5)
    # And it tops the per-rank lateness table
    top = rows(
        run, "SELECT world_rank FROM rank_lateness ORDER BY arrival_lag_caused_ns DESC LIMIT 1"
    )
    assert top[0]["world_rank"] == fault["rank"]


def test_a_slow_gpu_starts_last_while_calling_on_time(sim) -> None:
    # Given a job where rank 2's GPU starts the first op of each step 3000 us late
    directory = sim("slow_gpu")
    fault = truth(directory)["faults"][0]
    # When aligned
    run, _ = aligned(directory)
    hit = affected_collectives(run, fault, first_op_only=True)
    # Then rank 2 is the last GPU starter there, about 3000 us behind the median...
    assert [c["last_gpu_world_rank"] for c in hit].count(fault["rank"]) >= 0.95 * len(hit)
    lag = statistics.median(c["last_gpu_vs_median_ns"] for c in hit)
    assert lag == pytest.approx(fault["slow_us"] * 1e3, rel=0.1)
    # ...while its API calls are not late
    calls = rows(
        run,
        "SELECT avg(arrival_lag_ns) AS lag FROM collective_ranks "
        "WHERE world_rank = ? AND comm_key = ? AND seq >= ?",
        [fault["rank"], hit[0]["comm_key"], hit[0]["seq"]],
    )
    assert abs(calls[0]["lag"]) < 0.1 * fault["slow_us"] * 1e3


def test_transfer_time_and_bus_bandwidth_follow_the_nccl_tests_factors(sim) -> None:
    # Given an aligned job
    run, _ = aligned(sim("plain"))
    # Then bus bandwidth is traffic / transfer time x the nccl-tests factor
    for c in rows(run, "SELECT * FROM collectives WHERE transfer_ns > 0 LIMIT 200"):
        n = c["n_ranks"]
        factor = {"AllReduce": 2 * (n - 1) / n}.get(c["func"], 1.0)
        assert c["busbw_gbs"] == pytest.approx(c["msg_bytes"] / c["transfer_ns"] * factor)
        # and the transfer time is never longer than any rank's own duration (+ rounding)
        assert c["transfer_ns"] <= c["min_duration"] + 2


def test_sends_meet_their_receives(sim) -> None:
    # Given a job with pipeline-parallel sends and receives
    directory = sim("plain")
    run, _ = aligned(directory)
    # Then every Send is paired with the Recv on its peer, in order
    p2p = truth(directory)["records"]["p2p"]
    assert run.count("p2p_pairs") == p2p // 2
    assert run.meta["p2p_unmatched"] == 0
    pairs = rows(run, "SELECT * FROM p2p_pairs LIMIT 50")
    assert all(p["transfer_ns"] > 0 and p["sender"] != p["receiver"] for p in pairs)


def test_a_job_without_p2p_ops_gets_the_pairs_table_the_sql_would_make(sim, tmp_path) -> None:
    # Given a job with sends and receives, and one of collectives only
    run, _ = aligned(sim("plain"))
    write_lines(tmp_path / "example-hostname-pid1.log", [inspector_coll(0, sn) for sn in range(3)])
    bare, _ = aligned(tmp_path)
    # Then the job without P2P ops has an empty p2p_pairs of the SQL form's columns and
    # types (spelled out in P2P_PAIRS_TYPES), and nothing unmatched
    described = [(name, kind) for name, kind, *_ in run.sql("DESCRIBE p2p_pairs").fetchall()]
    assert run.count("p2p_pairs") > 0
    assert described == list(P2P_PAIRS_TYPES)
    assert bare.sql("DESCRIBE p2p_pairs").fetchall() == run.sql("DESCRIBE p2p_pairs").fetchall()
    assert bare.count("p2p_pairs") == 0 and bare.meta["p2p_unmatched"] == 0


def test_inspector_records_align_too(tmp_path) -> None:
    # Given Inspector logs of two ranks on one host (no rankwatch block)
    for rank in (0, 1):
        write_lines(
            tmp_path / f"example-hostname-pid{1639453 + rank}.log",
            [inspector_coll(rank, sn, verbose=True) for sn in range(4)]
            + [inspector_p2p(rank, 4, "Send" if rank == 0 else "Recv", 1 - rank)],
        )
    # When aligned
    run, clock = aligned(tmp_path)
    # Then the collectives are matched by (comm, func, seq) across the two ranks
    coll = rows(run, "SELECT * FROM collectives ORDER BY seq")
    assert [c["n_seen"] for c in coll] == [2, 2, 2, 2]
    assert run.count("p2p_pairs") == 1
    assert clock.hosts[0].method == "single_host"
