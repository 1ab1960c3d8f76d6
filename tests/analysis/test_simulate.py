"""rankwatch.simulate: a synthetic job written exactly in the plugin's format."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from analysis_support import JOBS, truth

from rankwatch import schema
from rankwatch.errors import ConfigError
from rankwatch.simulate import SimConfig, SlowFault, simulate
from rankwatch.simulate.fastfmt import LineFormat


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_record_is_valid_against_the_schema(sim) -> None:
    # Given a simulated job with every communicator kind
    directory = sim("plain")
    # When its files are read back
    op_files = sorted(directory.glob("*.log"))
    state_files = sorted(directory.glob("*.rwstate.jsonl"))
    # Then there is one op file and one state file per process, named like the plugin's
    assert len(op_files) == len(state_files) == JOBS["plain"].ranks
    assert all(f.name.split("-pid")[1][:-4].isdigit() for f in op_files)
    # And sampled op lines and every state line validate against rankwatch.schema
    sample = random.Random(0).sample(lines(op_files[0]), 200)
    assert all(schema.validate_op_record(r) == [] for r in sample)
    for path in state_files[:4]:
        assert all(schema.validate_state_record(r) == [] for r in lines(path))
    # And keys come in the plugin's order (rankwatch.schema lists them in that order)
    ext = sample[0]["rankwatch"]
    assert list(ext) == [f.name for f in schema.RANKWATCH]


def test_records_are_consistent_with_themselves(sim) -> None:
    # Given the op records of one process
    records = lines(sorted(sim("plain").glob("*.log"))[0])
    for r in records[:500]:
        ext = r["rankwatch"]
        perf = r["coll_perf"] if "coll_perf" in r else r["p2p_perf"]
        # Then the plugin's invariants hold: arrival is the API call, GPU times are the
        # raw GPU timer plus the offset, the exec time is their difference
        assert ext["arrival_ns"] == ext["api_start_ns"]
        assert ext["api_start_ns"] <= ext["enqueue_start_ns"] <= ext["enqueue_end_ns"]
        assert ext["enqueue_end_ns"] < ext["gpu_start_ns"] < ext["gpu_end_ns"]
        assert ext["gpu_start_ns"] == ext["gpu_start_raw_ns"] + ext["clock_offset_ns"]
        assert ext["exec_time_ns"] == ext["gpu_end_ns"] - ext["gpu_start_ns"]
        assert perf[f"{ext['kind']}_exec_time_us"] == ext["exec_time_ns"] // 1000
        assert ext["msg_size_bytes"] == ext["count"] * 2 or ext["datatype"] != "ncclBfloat16"


def test_a_hung_rank_stops_and_its_peers_wait_forever(sim) -> None:
    # Given a job where rank 3 stops issuing NCCL calls at step 20
    directory = sim("hang")
    t = truth(directory)
    fault = t["faults"][0]
    hung = next(r for r in t["ranks"] if r["rank"] == fault["rank"])
    peer = next(r for r in t["ranks"] if r["rank"] == 2)  # its TP peer
    # Then no process's state file ends with a teardown (no finalize/exit records)
    for r in t["ranks"]:
        state = lines(directory / r["state_file"])
        assert {s.get("reason") for s in state} <= {None, "interval"}
    # And the peer's last progress shows the stuck collective in flight, GPU started
    progress = [s for s in lines(directory / peer["state_file"]) if s["kind"] == "progress"]
    last_tick = [s for s in progress if s["ts_ns"] == progress[-1]["ts_ns"]]
    assert sum(s["in_flight_count"] for s in last_tick) >= 1
    states = {op["state"] for s in last_tick for op in s["in_flight"]}
    assert "gpu_started" in states
    # And the hung rank has nothing in flight: it never issued the op
    final = [s for s in lines(directory / hung["state_file"]) if s["kind"] == "progress"][-1]
    assert final["in_flight_count"] == 0
    assert fault["peers_stuck_in_kernel"]


def test_a_desynced_rank_issues_a_different_size_at_the_same_seq(sim) -> None:
    directory = sim("desync")
    fault = truth(directory)["faults"][0]
    by_rank = {}
    for r in truth(directory)["ranks"]:
        for rec in lines(directory / r["op_file"]):
            if (
                rec["header"]["id"] == fault["comm_id"]
                and rec["rankwatch"]["seq"] == fault["seq"]
                and rec["rankwatch"]["func"] == fault["func"]
            ):
                by_rank[r["rank"]] = rec["rankwatch"]["count"]
    odd = {rank for rank, n in by_rank.items() if n != by_rank[0 if fault["rank"] else 1]}
    assert odd == {fault["rank"]}


def test_the_same_seed_writes_the_same_bytes(tmp_path) -> None:
    cfg = SimConfig(ranks=4, hosts=2, steps=5, seed=9, clock_offset_us=100, workers=1)
    simulate(cfg, tmp_path / "a")
    simulate(
        SimConfig(ranks=4, hosts=2, steps=5, seed=9, clock_offset_us=100, workers=2), tmp_path / "b"
    )
    for f in sorted((tmp_path / "a").glob("*-pid*")):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ranks": 6, "hosts": 4},
        {"ranks": 8, "tp": 3},
        {"ranks": 8, "steps": 0},
        {"ranks": 8, "slow": SlowFault(9, 0, "host", 1.0)},
        {"ranks": 8, "slow": SlowFault(1, 0, "disk", 1.0)},
    ],
)
def test_impossible_settings_are_config_errors(kwargs) -> None:
    with pytest.raises(ConfigError):
        SimConfig(**kwargs)


def test_line_format_matches_percent_formatting() -> None:
    # Given a template with ints and fixed-point floats of every width
    template = '{"a":%d,"b":%.6f,"c":"x%%y","d":%d}'
    rng = np.random.default_rng(1)
    ints = rng.integers(0, 10**18, 500) // rng.integers(1, 10**17, 500)
    floats = rng.random(500) * 10.0 ** rng.integers(-3, 6, 500)
    # When rendered column-wise
    got = LineFormat(template).render([ints, floats, ints * 3])
    # Then each line equals Python's rendering (floats rounded half away from zero)
    want = [
        (template % row).encode()
        for row in zip(ints.tolist(), floats.tolist(), (ints * 3).tolist(), strict=True)
    ]
    assert [bytes(g) for g in got] == want
