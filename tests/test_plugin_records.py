"""The plugin's records, driven by the fake NCCL driver in NCCL 2.28.9's call orders."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from driver import CAPTURES, issued_colls, recorded_colls, run_driver
from rankwatch.schema import validate_op_record, validate_state_record

GPU_AHEAD_NS = 500_000  # the driver's GPU timer runs this far ahead of the host clock


def test_every_collective_of_the_pytorch_workload_is_recorded_once(tmp_path: Path) -> None:
    # Given the driver replaying the captured PyTorch workload phase by phase
    run = run_driver(tmp_path, "--scenario", "workload")
    assert run.returncode == 0, run.stderr
    # Then each complete collective has exactly one record
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)


def test_p2p_ops_are_recorded_per_peer_with_matching_order(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "p2p")
    assert run.returncode == 0, run.stderr
    records = [r for r in run.op_records() if "p2p_perf" in r]
    for comm in run.summary["comms"]:
        for func, peers in comm["p2p"].items():
            for peer, n in peers.items():
                mine = [
                    r["rankwatch"]
                    for r in records
                    if r["header"]["id"] == comm["comm_id"]
                    and r["p2p_perf"]["p2p"] == func
                    and r["p2p_perf"]["p2p_peer"] == int(peer)
                ]
                # The per (peer, direction) order counts from 0 without gaps
                assert sorted(m["seq"] for m in mine) == list(range(n))
        self_ops = sum(comm["p2p_self"].values())
        self_records = [
            r for r in records if r["p2p_perf"]["p2p_peer"] == comm["rank"]
        ]
        # NCCL gives P2P with the rank itself no channel events: recorded, not GPU-timed
        assert len(self_records) == self_ops
        assert all(not r["rankwatch"]["gpu_timed"] for r in self_records)
        assert all(r["rankwatch"]["complete"] for r in self_records)


def test_every_record_matches_the_documented_schema(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "workload")
    ops, states = run.op_records(), run.state_records()
    assert ops and states
    problems = [p for r in ops for p in validate_op_record(r)]
    problems += [p for r in states for p in validate_state_record(r)]
    assert problems == []
    assert {r["kind"] for r in states} == {"comm", "progress", "clock", "stats"}


def test_timestamps_are_ordered_and_on_the_host_clock(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "basic", "--ops", "40")
    timed = [r["rankwatch"] for r in run.op_records() if r["rankwatch"]["gpu_timed"]]
    assert len(timed) >= 40
    for r in timed:
        slack = r["clock_error_ns"]
        assert r["api_start_ns"] <= r["api_end_ns"] <= r["enqueue_start_ns"]
        assert r["enqueue_start_ns"] <= r["enqueue_end_ns"]
        assert r["arrival_ns"] <= r["gpu_start_ns"] + slack
        assert r["gpu_start_ns"] <= r["gpu_end_ns"]
        assert r["exec_time_ns"] == r["gpu_end_ns"] - r["gpu_start_ns"]
        # The GPU timer ran ahead: the estimated offset brackets the truth
        assert abs(r["clock_offset_ns"] + GPU_AHEAD_NS) <= slack + 2_000
        assert r["gpu_start_raw_ns"] - r["gpu_start_ns"] == -r["clock_offset_ns"]


def test_clock_records_bound_the_gpu_timer_offset(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "basic", "--ops", "40")
    clocks = [c for c in run.state_records("clock") if c["offset_ns"] is not None]
    assert clocks
    for c in clocks:
        assert c["lower_ns"] <= -GPU_AHEAD_NS + 2_000
        assert c["upper_ns"] >= -GPU_AHEAD_NS - 2_000
        assert c["error_ns"] == (c["upper_ns"] - c["lower_ns"]) // 2


def test_bandwidth_follows_the_nccl_tests_factors(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "basic")
    for r in run.op_records():
        perf, n = r["coll_perf"], r["header"]["n_ranks"]
        if not r["rankwatch"]["gpu_timed"] or perf["coll_exec_time_us"] == 0:
            continue
        secs = r["rankwatch"]["exec_time_ns"] / 1e9
        traffic = perf["coll_msg_size_bytes"]
        factor = {"AllReduce": 2 * (n - 1) / n, "AllGather": (n - 1) / n,
                  "ReduceScatter": (n - 1) / n}.get(perf["coll"], 1)
        if perf["coll"] in ("AllGather", "ReduceScatter"):
            traffic *= n
        assert perf["coll_algobw_gbs"] == pytest.approx(traffic / 1e9 / secs, rel=1e-4)
        assert perf["coll_busbw_gbs"] == pytest.approx(traffic / 1e9 / secs * factor, rel=1e-4)


def test_graph_replays_are_recorded_from_the_callback_thread(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "graph", "--ops", "5")
    assert run.returncode == 0, run.stderr
    replays = [r["rankwatch"] for r in run.op_records() if r["rankwatch"]["graph_captured"]]
    # The scenario replays a one-op graph and a three-op graph 5 times each
    assert sum(c["graph_replays"] for c in run.summary["comms"]) == 10
    assert len(replays) == 5 * (1 + 3)
    # Replays have no application call: their arrival is NCCL's host callback
    assert all(r["api_start_ns"] is None and r["arrival_ns"] == r["enqueue_start_ns"]
               for r in replays)
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)


@pytest.mark.parametrize("abi", ["4", "6"])
def test_other_interface_versions_record_the_same_ops(tmp_path: Path, abi: str) -> None:
    run = run_driver(tmp_path, "--scenario", "basic", "--abi", abi)
    assert run.returncode == 0, run.stderr
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)
    comm = run.state_records("comm")[0]
    assert comm["abi_version"] == int(abi)


def test_two_communicators_and_a_group_spanning_both(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "multicomm")
    assert run.returncode == 0, run.stderr
    assert len({c["comm_id"] for c in run.summary["comms"]}) == 2
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)


def test_reload_cycles_keep_recording(tmp_path: Path) -> None:
    # NCCL dlcloses the plugin after the last communicator and may load it again
    run = run_driver(tmp_path, "--scenario", "basic", "--cycles", "3")
    assert run.returncode == 0, run.stderr
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)


def test_concurrent_inits_all_get_recorded(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "concurrent-init", "--threads", "8", "--comms", "4")
    assert run.returncode == 0, run.stderr
    comms = run.state_records("comm")
    assert len(comms) == sum(c["inits"] for c in run.summary["comms"])
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)


def test_hostile_calls_are_ignored_without_harm(tmp_path: Path) -> None:
    # NULL contexts, foreign-pid proxy ops, NULL state args, unknown types and states
    run = run_driver(tmp_path, "--scenario", "robustness")
    assert run.returncode == 0, run.stderr
    stats = run.state_records("stats")[-1]
    assert stats["dropped_pool_full"] == 0 and stats["write_errors"] == 0
    # Every regular op is recorded; the deliberately malformed ones may add records
    issued, recorded = issued_colls(run.summary), recorded_colls(run.op_records())
    irregular = sum(c["irregular"] for c in run.summary["comms"])
    assert all(recorded.get(key, 0) >= n for key, n in issued.items())
    assert sum(recorded.values()) <= sum(issued.values()) + irregular


def test_ops_cut_off_by_an_abort_are_written_as_incomplete(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "abort")
    assert run.returncode == 0, run.stderr
    incomplete = [r for r in run.op_records() if not r["rankwatch"]["complete"]]
    expected = sum(sum(c["colls_incomplete"].values()) for c in run.summary["comms"])
    assert len(incomplete) >= expected > 0


@pytest.mark.skipif(not CAPTURES.is_dir(), reason="real NCCL captures not available")
@pytest.mark.parametrize(
    "capture", sorted(p.relative_to(CAPTURES).as_posix() for p in CAPTURES.glob("*/*.txt.gz"))
    if CAPTURES.is_dir() else [],
)
def test_real_nccl_captures_replay_into_complete_records(tmp_path: Path, capture: str) -> None:
    # Given a callback sequence real NCCL 2.28.9 made on an H200
    text = tmp_path / "capture.txt"
    text.write_bytes(gzip.decompress((CAPTURES / capture).read_bytes()))
    dump = tmp_path / "dump"
    run = run_driver(dump, "--replay", str(text))
    assert run.returncode == 0, run.stderr
    lines = text.read_text().splitlines()
    colls = sum(" type=Coll " in line and " start " in line for line in lines)
    p2ps = sum(" type=P2p " in line and " start " in line for line in lines)
    records = run.op_records()
    # Then every Coll and P2p event of the capture became one record
    assert sum("coll_perf" in r for r in records) == colls
    assert sum("p2p_perf" in r for r in records) == p2ps
    stats = run.state_records("stats")[-1]
    assert stats["dropped_pool_full"] == 0
