"""The detectors' building blocks, and their protocol, on small inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rankwatch.align import align
from rankwatch.detect import DETECTORS, Stream, Topology, detect
from rankwatch.detect.period import SlotMap, find_period
from rankwatch.detect.robust import cusum, group_median, run_lengths
from rankwatch.detect.source import windows
from rankwatch.simulate import SimConfig, SlowFault, simulate
from rankwatch.store import ingest

# ----------------------------------------------------------------- robust statistics


def test_group_median_matches_numpy_per_group() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(2e7, 3e5, 5000)
    values[::97] = np.nan
    groups = rng.integers(0, 40, 5000)
    got = group_median(values, groups, 41)
    for g in range(40):
        v = values[(groups == g) & np.isfinite(values)]
        assert got[g] == pytest.approx(np.median(v))
    assert math.isnan(got[40])  # a group without values


def _reference_runs(hit, group, carry):
    state = dict(enumerate(carry))
    out = []
    for h, g in zip(hit, group, strict=True):
        state[g] = state[g] + 1 if h else 0
        out.append(state[g])
    return out


def test_run_lengths_carry_across_batches() -> None:
    rng = np.random.default_rng(1)
    group = np.sort(rng.integers(0, 5, 200))
    hit = rng.random(200) < 0.7
    carry = rng.integers(0, 4, 5)
    run, _ = run_lengths(hit, group, carry)
    assert run.tolist() == _reference_runs(hit.tolist(), group.tolist(), carry.tolist())


def test_cusum_is_the_lindley_recursion_per_group() -> None:
    rng = np.random.default_rng(2)
    group = np.sort(rng.integers(0, 4, 300))
    step = rng.normal(-0.5, 2.0, 300)
    carry = np.array([0.0, 3.0, 0.0, 7.5])
    s, _ = cusum(step, group, carry)
    state = dict(enumerate(carry))
    for i, g in enumerate(group.tolist()):
        state[g] = max(0.0, state[g] + step[i])
        assert s[i] == pytest.approx(state[g])


def test_period_of_a_training_step_and_its_slots() -> None:
    step = [11, 11, 11, 11, 12, 13]  # e.g. 4 gradient buckets, grad norm, a TP op
    symbols = np.array([7] + step * 20)  # after a warm-up op
    assert find_period(symbols) == 6
    slots = SlotMap({100: 4, 200: 1})
    codes = slots.codes(np.array([100, 100, 200, 300]), np.array([5, 8, 9, 9]))
    assert codes.tolist() == [1, 0, 4, 5]  # 300 was unseen: one slot of its own
    assert slots.slot_of(1) == (100, 1)


# ----------------------------------------------------------------- the stream


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slow")
    cfg = SimConfig(
        ranks=8,
        hosts=2,
        steps=120,
        tp=2,
        seed=7,
        clock_offset_us=4000,
        slow=SlowFault(5, 20, "gpu", 2500),
    )
    simulate(cfg, out)
    return out


def _aligned(path: Path):
    run = ingest([path]).run()
    return run, align(run)


def test_findings_have_every_field_and_are_plain_data(slow_run: Path) -> None:
    run, clock = _aligned(slow_run)
    findings = detect(run, clock)
    assert [(f.kind, f.rank, f.cause) for f in findings] == [("straggler", 5, "gpu")]
    f = findings[0]
    assert f.host and f.pid and f.comm and f.comm.id.startswith("0x") and f.comm.name
    assert f.since.ns > 1.7e18 and f.since.seq == 20 * 8  # TP AllReduce seq at step 20
    assert f.cost_s > 0 and 0 < f.confidence <= 1
    assert f.evidence["victims"] and all(v["rank"] != 5 for v in f.evidence["victims"])
    assert f.evidence["cost"]["share_of_wall"] > 0
    json.dumps(f.to_dict())  # evidence is plain data
    assert run.meta["detect"]["total_cost_s"] == pytest.approx(f.cost_s)


@pytest.mark.parametrize("batch", [997, 8192])
def test_small_batches_give_the_same_findings_as_one_batch(slow_run: Path, batch: int) -> None:
    """Live monitoring sees records in small batches; offline in big ones."""
    run, clock = _aligned(slow_run)
    whole = detect(run, clock, batch=1 << 20)
    parts = detect(run, clock, batch=batch)
    key = [(f.kind, f.rank, f.cause, f.since, f.comm) for f in whole]
    assert [(f.kind, f.rank, f.cause, f.since, f.comm) for f in parts] == key
    assert parts[0].cost_s == pytest.approx(whole[0].cost_s, rel=0.02)


def test_stream_protocol_feed_then_close(slow_run: Path) -> None:
    run, _ = _aligned(slow_run)
    topo = Topology.from_run(run)
    stream = Stream(topo)
    for ops, progress, now in windows(run, topo, 4096):
        stream.feed(ops, progress, now)
    assert [f.rank for f in stream.findings()] == [5]  # known before the stream ends
    assert [f.rank for f in stream.close()] == [5]
    assert len(stream.detectors) == len(DETECTORS)


def test_live_topology_from_comm_records_matches_the_stored_one(slow_run: Path) -> None:
    """A live monitor knows the job from the `comm` state records only."""
    run, _ = _aligned(slow_run)
    cur = run.con.execute("SELECT comm_id, comm_name, n_ranks, nnodes, rank, host, pid FROM comms")
    names = [d[0] for d in cur.description]
    live = Topology.build([dict(zip(names, row, strict=True)) for row in cur.fetchall()])
    stored = Topology.from_run(run)
    assert [p.world_rank for p in live.procs] == [p.world_rank for p in stored.procs]
    assert [c.key for c in live.comms] == [c.key for c in stored.comms]
    assert live.world == stored.world and live.n_classes == stored.n_classes


def test_memory_is_bounded_by_the_window(slow_run: Path) -> None:
    """Held records: cohorts in progress and the last few steps, not the job."""
    run, _ = _aligned(slow_run)
    topo = Topology.from_run(run)
    stream = Stream(topo)
    held = []
    for ops, progress, now in windows(run, topo, 2048):
        stream.feed(ops, progress, now)
        cost = next(d for d in stream.detectors if type(d).__name__ == "CostDetector")
        held.append(
            len(stream.assembler.pending) + cost.open_n + sum(len(s.raw) for s in cost.recent)
        )
    held = held[len(held) // 2 :]  # once the step period is learned
    total = run.count("ops")
    assert max(held) < 0.25 * total
