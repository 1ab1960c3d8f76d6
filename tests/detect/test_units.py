"""The detectors' building blocks, and their protocol, on small inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rankwatch.align import align
from rankwatch.detect import DETECTORS, Stream, Topology, detect
from rankwatch.detect.period import (
    LearnTally,
    SlotMap,
    enough_to_learn,
    find_period,
    learn_periods,
)
from rankwatch.detect.records import Recs
from rankwatch.detect.robust import (
    cusum,
    group_median,
    run_lengths,
    segmented_accumulate,
    segmented_ewma,
    stable_order,
    trailing_misses,
)
from rankwatch.detect.source import windows
from rankwatch.detect.straggler import CHANCE_BINS, _chance_pairs, _inlier_ewma, _runs_at_hits
from rankwatch.detect.topology import FUNCS
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


def test_segmented_accumulate_is_a_loop_per_segment() -> None:
    """Sums and running minima segment by segment, element by element as a loop
    takes them (the same doubles, not just close), for segments of every length
    around the powers of two the rows are padded to."""
    rng = np.random.default_rng(4)
    lengths = np.r_[1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, rng.integers(1, 70, 40)]
    heads = np.cumsum(lengths) - lengths
    x = rng.standard_t(2, int(lengths.sum())) * 10.0 ** rng.integers(-3, 6, int(lengths.sum()))
    for ufunc, step in ((np.add, lambda a, b: a + b), (np.minimum, min)):
        got = segmented_accumulate(x, heads, ufunc)
        want = []
        for h, n in zip(heads.tolist(), lengths.tolist(), strict=True):
            acc = x[h]
            want.append(acc)
            for v in x[h + 1 : h + n]:
                acc = step(acc, v)
                want.append(acc)
        assert got.tolist() == want
    assert len(segmented_accumulate(np.zeros(0), np.zeros(0, np.int64), np.add)) == 0


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


def test_run_lengths_start_and_trailing_misses_match_a_loop() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        group = np.sort(rng.integers(0, 4, n))
        hit = rng.random(n) < rng.random()
        carry = rng.integers(0, 3, 4) * (rng.random(4) < 0.5)
        miss_carry = rng.integers(0, 5, 4)
        run, started = run_lengths(hit, group, carry)
        state, begin = dict(enumerate(carry.tolist())), {}
        for i, (h, g) in enumerate(zip(hit.tolist(), group.tolist(), strict=True)):
            first_here = i == 0 or group[i - 1] != g
            if not h:
                state[g] = 0
                continue
            if state[g] == 0 or (first_here and g not in begin):
                begin[g] = i if state[g] == 0 else -1
            state[g] += 1
            assert run[i] == state[g] and started[i] == begin[g]
        last, miss = trailing_misses(hit, group, miss_carry)
        for k, i in enumerate(last.tolist()):
            g, j, m = group[i], i, 0
            while j >= 0 and group[j] == g and not hit[j]:
                m, j = m + 1, j - 1
            reaches_start = j < 0 or group[j] != g
            assert miss[k] == m + (miss_carry[g] if reaches_start else 0)


def test_rank_runs_at_hits_match_the_sorted_runs() -> None:
    """The straggler detector's per-rank runs, found at the hits, equal a sort of all."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        proc = rng.integers(0, 5, n)
        keys = (proc << 20) | (rng.integers(0, 6, n) << 8) | np.arange(n)
        hit = rng.random(n) < rng.random()
        carry, miss_carry = rng.integers(0, 3, 5), rng.integers(0, 7, 5)
        order = np.argsort(keys)
        run, started = run_lengths(hit[order], proc[order], carry)
        last, miss = trailing_misses(hit[order], proc[order], miss_carry)
        procs, last_hit, miss2, h_op, h_run, h_start = _runs_at_hits(
            keys, proc, hit, carry, miss_carry
        )
        at = np.flatnonzero(hit[order])
        assert procs.tolist() == proc[order][last].tolist() and miss2.tolist() == miss.tolist()
        assert h_op.tolist() == order[at].tolist() and h_run.tolist() == run[at].tolist()
        began = np.where(started[at] >= 0, order[np.maximum(started[at], 0)], -1)
        assert h_start.tolist() == began.tolist()
        ends_hit = hit[order][last]
        assert (last_hit >= 0).tolist() == ends_hit.tolist()


def test_stable_order_is_a_stable_argsort() -> None:
    rng = np.random.default_rng(6)
    for bound in (7, 1 << 16, 1 << 20, 1 << 40):
        key = rng.integers(0, bound, 5000)
        assert np.array_equal(stable_order(key, bound), np.argsort(key, kind="stable"))


def test_period_of_a_training_step_and_its_slots() -> None:
    step = [11, 11, 11, 11, 12, 13]  # e.g. 4 gradient buckets, grad norm, a TP op
    symbols = np.array([7] + step * 20)  # after a warm-up op
    assert find_period(symbols) == 6
    slots = SlotMap({100: 4, 200: 1})
    codes = slots.codes(np.array([100, 100, 200, 300]), np.array([5, 8, 9, 9]))
    assert codes.tolist() == [1, 0, 4, 5]  # 300 was unseen: one slot of its own
    assert slots.slot_of(1) == (100, 1)


def _ops(procs: range, step: list[tuple[int, int]], steps: int, t0: float) -> Recs:
    """Records of processes repeating `step` ((kind, size) per op) `steps` times."""
    n = len(step) * steps
    sym = np.tile([k for k, _ in step], steps)
    msg = np.tile([m for _, m in step], steps)
    cols = {"proc": [], "sym": [], "msg": [], "arrival_c": []}
    for p in procs:
        cols["proc"].append(np.full(n, p))
        cols["sym"].append(sym)
        cols["msg"].append(msg)
        cols["arrival_c"].append(t0 + np.arange(n) * 1e5 + p)
    return Recs({k: np.concatenate(v) for k, v in cols.items()})


def test_a_kind_few_processes_use_is_learned_from_them() -> None:
    """Ten data-parallel ranks and, created later, a two-rank communicator whose kind
    occurs twice per step: its period comes from the two that use it, though the
    others have more ops."""
    dp = _ops(range(10), [(11, 4096), (11, 8192), (12, 64)], 300, 0.0)
    late = _ops(range(10, 12), [(40, 1024), (40, 2048), (41, 64)], 100, 5e7)
    both = Recs.concat([dp, late])
    assert learn_periods(both) == {11: 2, 12: 1, 40: 2, 41: 1}
    assert learn_periods(both, np.array([40, 41])) == {40: 2, 41: 1}
    assert enough_to_learn(both, np.array([40, 41]))
    short = late.take(np.flatnonzero(late.arrival_c < 5e7 + 200 * 1e5))  # 200 ops each
    assert not enough_to_learn(Recs.concat([dp, short]), np.array([40]))


def test_the_learn_tally_answers_as_enough_to_learn_batch_by_batch() -> None:
    """Records arriving in batches (kinds some processes use, processes with few and
    many ops): after each batch the tally agrees with enough_to_learn over all
    records so far, for several sets of kinds, the empty one included."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        n_procs = int(rng.integers(2, 40))
        tally, seen = LearnTally(n_procs), []
        for _ in range(int(rng.integers(1, 12))):
            n = int(rng.integers(0, 400))
            proc = rng.integers(0, n_procs, n)
            sym = rng.integers(0, 6, n) + 10 * (proc % 3)  # kinds per process group
            part = Recs({"proc": proc.astype(np.int32), "sym": sym})
            seen.append(part)
            tally.add(part)
            allr = Recs.concat(seen)
            for syms in ([], [10], [10, 21], [0, 1, 2, 25], [99]):
                want = enough_to_learn(allr, np.array(syms, dtype=np.int64))
                assert tally.enough(np.array(syms, dtype=np.int64)) == want, (syms, len(allr))


def _ewma_loop(x, seg, init, alpha, floor=None):
    out, cur, last = np.full(len(x), np.nan), 0.0, None
    for i in range(len(x)):
        if seg[i] != last:
            cur, last = (init[i] if np.isfinite(init[i]) else x[i]), seg[i]
        if floor is None or x[i] <= 3.0 * max(cur, floor):
            cur += alpha * (x[i] - cur)
            out[i] = cur
    return out


@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.05, 0.001])
def test_segmented_ewma_is_one_update_per_element(alpha: float) -> None:
    rng = np.random.default_rng(7)
    n = 5000
    seg = np.sort(rng.integers(0, 6, n))
    x = rng.gamma(2.0, 3.0, n)
    init = np.where(rng.random(6) < 0.5, np.nan, 10 * rng.random(6))[seg]
    got = segmented_ewma(x, seg, init, alpha)
    assert np.allclose(got, _ewma_loop(x, seg, init, alpha), rtol=1e-12)


def test_inlier_ewma_takes_the_inliers_a_pass_in_order_would() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        n = int(rng.integers(1, 500))
        seg = np.sort(rng.integers(0, 4, n))
        x = rng.gamma(1.5, 2.0, n) * np.where(rng.random(n) < 0.15, 8.0, 1.0)
        init = (0.5 + 4 * rng.random(4))[seg]
        got = _inlier_ewma(x, seg, init, 0.05, 0.1)
        assert np.allclose(got, _ewma_loop(x, seg, init, 0.05, 0.1), rtol=1e-12, equal_nan=True)


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


def test_chance_pairs_count_ordered_pairs_of_late_ops_like_the_pair() -> None:
    """_chance_pairs is the number of ordered pairs (a, b) of the late ops in the
    histogram (self-pairs included) both at least the pair's smaller bin and at most
    |b1 - b2| + 1 bins apart: enumerated here one late op at a time."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        hist = np.zeros(CHANCE_BINS, dtype=np.int64)
        bins = rng.integers(0, CHANCE_BINS, int(rng.integers(0, 40)))
        np.add.at(hist, bins, rng.integers(1, 4, len(bins)))
        b1, b2 = (int(x) for x in rng.integers(0, CHANCE_BINS, 2))
        lo, apart = min(b1, b2), abs(b1 - b2) + 1
        late = np.repeat(np.arange(CHANCE_BINS), hist)
        late = late[late >= lo]
        want = int(np.sum(np.abs(late[:, None] - late[None, :]) <= apart))
        got = _chance_pairs(hist, b1, b2)
        assert got == (want if len(late) else 1.0), (b1, b2)
    # with no condition on how alike they are, B^2 (the rule before the banding)
    hist = np.zeros(CHANCE_BINS, dtype=np.int64)
    hist[[10, 30, 60, 90]] = [3, 2, 4, 1]
    assert _chance_pairs(hist, 0, CHANCE_BINS - 2) == 10**2


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
    assert f.evidence["detected_at"]["by"]["rule"] == "late steps in a row at one op"
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



def test_findings_judged_over_a_longer_span_shrink_to_what_is_worth_one(slow_run: Path) -> None:
    """A live job's Stream that a rebuild replaced is judged, at the end, against the
    whole job's wall time: the same delays are a smaller share of it, and below
    min_cost_share of it they are no finding (as `rankwatch analyze` would judge)."""
    run, _ = _aligned(slow_run)
    topo = Topology.from_run(run)
    stream = Stream(topo)
    for ops, progress, now in windows(run, topo, 4096):
        stream.feed(ops, progress, now)
    (own,) = stream.findings()
    first, last = stream.span_ns
    assert last - first == pytest.approx(stream.ctx.wall_ns)
    share = own.evidence["cost"]["share_of_wall"]
    rel = (first - topo.t0_ns, last - topo.t0_ns)
    (longer,) = stream.findings_over(rel[0], rel[1] + (last - first))  # twice as long
    assert longer.evidence["cost"]["share_of_wall"] == pytest.approx(share / 2)
    assert longer.cost_s == own.cost_s and longer.rank == own.rank
    cost = own.evidence["cost"]
    impact_s = max(own.cost_s, cost["alone_s"], own.evidence["own_delay_s"])
    needed = impact_s * 1e9 / stream.ctx.config.min_cost_share  # the wall it just fills
    assert stream.findings_over(rel[0], rel[0] + needed * 1.5) == []
    assert stream.ctx.wall_ns == pytest.approx(last - first)  # the Stream's own span kept
    assert [f.rank for f in stream.findings()] == [own.rank]
    stream.retire()  # the records it held go; what it found stays
    assert [f.rank for f in stream.findings()] == [own.rank]

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
        steps = {id(s.steps): s.steps for s in cost.recent}  # kept steps share their batch
        held.append(len(stream.assembler.pending) + cost.open_n + sum(map(len, steps.values())))
    held = held[len(held) // 2 :]  # once the step period is learned
    total = run.count("ops")
    assert max(held) < 0.25 * total


def test_a_rank_slow_on_and_off_has_the_same_episodes_in_any_batching(tmp_path: Path) -> None:
    """Rank 3 is slow for 20 steps, recovers for 30, is slow again for 40: two episodes,
    the finding starting at the longer one, whether the records come in one batch (as
    `analyze` reads them) or in small ones (as a live monitor gets them)."""

    from detect_scenarios import Extra, Scenario, _cfg, simulate_scenario

    extra = Extra(bursts=((3, 2500.0, "gpu", 20, 40), (3, 2500.0, "gpu", 70, 110)))
    simulate_scenario(Scenario("on-off", _cfg(8, 120, 51), extra), tmp_path / "job")
    run, clock = _aligned(tmp_path / "job")

    def key(batch: int) -> list[tuple]:
        found = detect(run, clock, batch=batch)
        return [(f.kind, f.rank, f.cause, f.since.seq, f.evidence.get("episodes")) for f in found]

    whole = key(1 << 20)
    assert [k[:3] for k in whole] == [("straggler", 3, "gpu")]
    assert whole[0][4] == 2
    assert key(997) == whole
    assert key(61) == whole


def _held_back(wins: list, proc: int, func: int, late_ns: float) -> tuple[list, tuple]:
    """The stream with one op of `proc` (of function `func`, early) moved to the
    first batch at least late_ns after it ended: how the plugin delivers an op whose
    channel events never came (written once a later op on its communicator has
    finished, and at least 2 s after its enqueue)."""
    batches = [(o, now) for o, _, now in wins if o is not None]
    k = 2
    ops, now = batches[k]
    pick = int(np.flatnonzero((ops.proc == proc) & (ops.func == func))[0])
    fields = list(ops.__dataclass_fields__)
    moved = {f: getattr(ops, f)[pick : pick + 1] for f in fields}
    keep = np.arange(len(ops)) != pick
    batches[k] = (type(ops)(**{f: getattr(ops, f)[keep] for f in fields}), now)
    ended = float(moved["gend_c"][0])
    j = next(i for i, (_, t) in enumerate(batches) if t >= ended + late_ns)
    o, t = batches[j]
    batches[j] = (type(o)(**{f: np.r_[getattr(o, f), moved[f]] for f in fields}), t)
    return batches, (int(moved["seq"][0]), FUNCS[func])


def test_an_op_delivered_seconds_late_is_no_desync(slow_run: Path) -> None:
    """The rank whose record is late is behind in its count of ops on the
    communicator only until its next op of that function shows the gap in the
    sequence numbers; before, it stayed behind until the record came, and its peer
    looked ahead for thousands of ops: a desync."""
    run, _ = _aligned(slow_run)
    topo = Topology.from_run(run)
    wins = list(windows(run, topo, 997))
    func = FUNCS.index("AllReduce")
    batches, (seq, name) = _held_back(wins, proc=0, func=func, late_ns=2.5e9)
    stream = Stream(topo)
    for ops, now in batches:
        stream.feed(ops, None, now)
    found = [(f.kind, f.rank, f.cause) for f in stream.close()]
    assert found == [("straggler", 5, "gpu")], (seq, name, found)


def test_an_op_in_flight_after_a_later_one_completed_is_no_hang(slow_run: Path) -> None:
    """A progress record shows an op in flight for 5 s whose rank has already completed
    later ops of the same function on the communicator (its last channel event never
    came; the plugin writes it later, marked incomplete): seen live on 2 H200, where it
    raised a hang alert that the next progress record withdrew."""
    from rankwatch.detect.columns import STATES

    run, _ = _aligned(slow_run)
    topo = Topology.from_run(run)
    wins = list(windows(run, topo, 997))
    k = next(i for i, (_, p, _) in enumerate(wins) if p is not None and i >= len(wins) // 2)
    ops, prog, now = wins[k]
    prog = prog.take(np.arange(len(prog)))  # a copy to change
    row, func = 0, FUNCS.index("AllReduce")
    assert prog.done[row, func] > 10
    prog.in_flight[row] = 1
    prog.if_func[row], prog.if_seq[row] = func, prog.done[row, func] - 10
    prog.if_state[row] = STATES.index("gpu_started")
    prog.if_age[row] = 5e9
    wins[k] = (ops, prog, now)
    stream = Stream(topo)
    for i, (ops, progress, now) in enumerate(wins):
        stream.feed(ops, progress, now)
        assert "hang" not in [f.kind for f in stream.findings()], f"window {i}"
    assert [(f.kind, f.rank) for f in stream.close()] == [("straggler", 5)]


def _confirmed_after(path: Path, batch: int, **config: float) -> list[tuple]:
    """(kind, rank, cause, ops of its kind from the onset to the confirmation)."""
    from rankwatch.detect.base import Config

    run, clock = _aligned(path)
    found = detect(run, clock, config=Config(**config), batch=batch)
    return [(f.kind, f.rank, f.cause, f.evidence["detected_at"]["seq"] - f.since.seq,
             f.evidence["detected_at"]["by"]["late_steps"]) for f in found]  # fmt: skip


@pytest.mark.parametrize("stalls_us", [0.0, 700.0, 6000.0])
def test_two_late_steps_fire_unless_as_large_stalls_came_by_chance(
    tmp_path: Path, stalls_us: float
) -> None:
    """Rank 3 is 2.5 ms late at one op per step from step 40 on (5 ops per step). In a
    clean job, or one whose only earlier stalls were smaller, it is confirmed at its
    second late step; after a dozen isolated stalls of other ranks larger than its
    delay, two in a row could be chance, and it takes the third. Always the third with
    the rule off (chance_runs=0). The same in any batching."""
    import dataclasses

    from detect_scenarios import Extra, Scenario, _cfg, simulate_scenario

    ranks = [0, 5, 2, 7, 1, 6] * 2 if stalls_us else []
    steps = range(8, 32, 2)[: len(ranks)]
    stalls = tuple((r, stalls_us, "gpu", s, s + 1) for r, s in zip(ranks, steps, strict=True))
    cfg = dataclasses.replace(_cfg(8, 80, 61), slow=SlowFault(3, 40, "gpu", 2500))
    simulate_scenario(Scenario("stalls", cfg, Extra(bursts=stalls)), tmp_path / "job")
    second = stalls_us < 2500.0
    want = [("straggler", 3, "gpu", 5 if second else 10, 2 if second else 3)]
    assert _confirmed_after(tmp_path / "job", 1 << 20) == want
    assert _confirmed_after(tmp_path / "job", 997) == want
    assert _confirmed_after(tmp_path / "job", 1 << 20, chance_runs=0.0) == [
        ("straggler", 3, "gpu", 10, 3)
    ]
