"""The detectors' compiled kernels (native/rwdetect.c) against their NumPy forms.

Each kernel replaces a NumPy computation of the record preparation; the NumPy
form is the reference. Both run over the same streams (as recorded, shuffled
within batches, with GPU starts gone stale or missing, with records delivered
late) and must give the same columns and carry the same state, bit for bit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from detect_scenarios import SUITE, Extra, Scenario, simulate_scenario

from rankwatch.align import align
from rankwatch.detect import Config, Topology, blame, detect, kernels, straggler
from rankwatch.detect.prepare import KEEP, Preparer
from rankwatch.detect.robust import cusum_lazy
from rankwatch.detect.source import windows
from rankwatch.simulate import SimConfig, SlowFault, simulate
from rankwatch.store import ingest

pytestmark = pytest.mark.skipif(
    kernels.library() is None, reason="the detectors' kernel library is not built"
)

STATE = ("carry_arrival", "carry_gend", "carry_uid", "op_count", "last_seq", "slot_end",
         "slot_start")  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("kernels")
    cfg = SimConfig(ranks=8, hosts=2, steps=60, tp=2, pp=2, seed=11, clock_offset_us=3000,
                    slow=SlowFault(3, 20, "host", 2000))  # fmt: skip
    simulate(cfg, out)
    run = ingest([out]).run()
    align(run)
    topo = Topology.from_run(run)
    return run, topo, [o for o, _, _ in windows(run, topo, 997) if o is not None]


def _replace(ops, index: np.ndarray | None = None, **cols):
    if index is not None:
        cols = {f: getattr(ops, f)[index] for f in ops.__dataclass_fields__} | cols
    return dataclasses.replace(ops, **cols)


def _shuffled(batches, rng):
    return [_replace(o, rng.permutation(len(o))) for o in batches]


def _damaged(batches, rng):
    """GPU starts moved before the previous op's end (stale), after the op's end,
    or lost (NaN); some arrivals lost too."""
    out = []
    for o in batches:
        gs, gsc, arr = o.gstart.copy(), o.gstart_c.copy(), o.arrival.copy()
        n = len(o)
        early = rng.random(n) < 0.05
        gs[early] -= 5e6
        gsc[early] -= 5e6
        late = rng.random(n) < 0.02
        gs[late] = o.gend[late] + 1e3
        gone = rng.random(n) < 0.03
        gs[gone], gsc[gone] = np.nan, np.nan
        arr[rng.random(n) < 0.01] = np.nan
        out.append(_replace(o, gstart=gs, gstart_c=gsc, arrival=arr))
    return out


def _edges(batches, rng):
    """The boundaries of each rule: starts just inside the stale slack of the
    previous op's end on the slot, ends tied with the process's previous op's,
    and records delivered twice (a seq equal to the highest so far)."""
    out = []
    for o in batches:
        gs, ge = o.gstart.copy(), o.gend.copy()
        last_end: dict[tuple[int, int], float] = {}
        last_proc_end: dict[int, float] = {}
        for i in range(len(o)):
            slot, p = (int(o.comm[i]), int(o.rank[i])), int(o.proc[i])
            roll = rng.random()
            if roll < 0.05 and slot in last_end:
                gs[i] = last_end[slot] - 1500.0  # inside STALE_SLACK_NS
            elif roll < 0.10 and p in last_proc_end:
                ge[i] = last_proc_end[p]  # ends with the previous op (one group kernel)
                gs[i] = min(gs[i], ge[i])
            elif roll < 0.15 and p in last_proc_end and last_proc_end[p] <= gs[i]:
                gs[i] = last_proc_end[p]  # starts exactly at the previous end
            last_end[slot], last_proc_end[p] = ge[i], ge[i]
        # each record once, some twice in a row (the stream order kept)
        index = np.repeat(np.arange(len(o)), np.where(rng.random(len(o)) < 0.02, 2, 1))
        out.append(_replace(_replace(o, gstart=gs, gend=ge), index))
    return out


def _late_records(batches, rng):
    """A few records held back by several batches (a gap in sequence numbers when
    the next op of their function comes, then the record itself, below it)."""
    out = [b for b in batches]
    for k in range(0, len(out) - 4, 3):
        o = out[k]
        pick = rng.choice(len(o), size=3, replace=False)
        keep = np.setdiff1d(np.arange(len(o)), pick)
        out[k] = _replace(o, keep)
        later = out[k + 3]
        out[k + 3] = dataclasses.replace(later, **{
            f: np.r_[getattr(later, f), getattr(o, f)[pick]] for f in o.__dataclass_fields__
        })  # fmt: skip
    return out


def _prepared(topo, batches, native: bool, monkeypatch) -> tuple[list, Preparer]:
    monkeypatch.setenv("RANKWATCH_NATIVE", "1" if native else "0")
    prep = Preparer(topo)
    return [prep(o) for o in batches], prep


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize(
    "stream", ["as_recorded", "shuffled", "damaged", "edges", "late_records"]
)
def test_prepared_columns_and_carried_state_match_numpy(job, monkeypatch, stream: str) -> None:
    _, topo, batches = job
    rng = np.random.default_rng(5)
    make = {"as_recorded": lambda b, r: b, "shuffled": _shuffled, "damaged": _damaged,
            "edges": _edges, "late_records": _late_records}[stream]  # fmt: skip
    batches = make(batches, rng)
    fast, fast_state = _prepared(topo, batches, True, monkeypatch)
    ref, ref_state = _prepared(topo, batches, False, monkeypatch)
    for i, (f, r) in enumerate(zip(fast, ref, strict=True)):
        for name in KEEP:
            assert _same(getattr(f, name), getattr(r, name)), (stream, i, name)
    for name in STATE:
        assert _same(getattr(fast_state, name), getattr(ref_state, name)), (stream, name)
    if stream == "late_records":  # the stream did exercise the gap rule
        assert any((p.op_index < 0).any() for p in fast)


def test_a_declining_kernel_changes_no_state() -> None:
    """Arrivals out of order within a slot: the stale-start kernel declines, and
    the NumPy path (which sorts) must find the carried state untouched."""
    slot_end, slot_start = np.full(2, 7.0), np.full(2, 3.0)
    got = kernels.stale_starts(
        np.array([0, 0]), np.array([2.0, 1.0]), np.array([5.0, 4.0]), np.array([6.0, 5.0]),
        slot_end, slot_start,
    )  # fmt: skip
    assert got is None
    assert slot_end.tolist() == [7.0, 7.0] and slot_start.tolist() == [3.0, 3.0]
    last_seq, count = np.full((1, 3), -1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    args = (np.zeros(2, bool), np.zeros(2, np.int64), np.zeros(2, np.int64), np.array([0, 1]))
    assert kernels.op_index(*args, np.array([9e6, 1.0]), last_seq, count) is None
    assert last_seq.tolist() == [[-1, -1, -1]] and count.tolist() == [0]
    # an index out of range is declined too (NumPy then raises as before)
    assert kernels.op_index(*args[:1], np.array([0, 5]), *args[2:], np.zeros(2), last_seq,
                            count) is None  # fmt: skip
    assert count.tolist() == [0]


def test_state_arrays_must_be_writable_in_place() -> None:
    with pytest.raises(TypeError, match="C-contiguous float64"):
        kernels.stale_starts(np.zeros(1, np.int64), np.zeros(1), np.zeros(1), np.zeros(1),
                             np.zeros(2, np.float32), np.zeros(2))  # fmt: skip


def test_findings_are_the_same_with_and_without_kernels(job, monkeypatch) -> None:
    run, topo, _ = job
    got = {}
    for native in ("1", "0"):
        monkeypatch.setenv("RANKWATCH_NATIVE", native)
        got[native] = [f.to_dict() for f in detect(run, batch=997)]
    assert got["1"] == got["0"]
    assert [(f["kind"], f["rank"], f["cause"]) for f in got["1"]] == [("straggler", 3, "host")]


def test_kernels_are_off_under_rankwatch_native_0(monkeypatch) -> None:
    monkeypatch.setenv("RANKWATCH_NATIVE", "0")
    assert kernels.library() is None


@pytest.mark.parametrize("name", ["three_stragglers_8", "gpu_and_transfer_16"])
def test_several_culprits_cost_the_same_with_and_without_kernels(
    name: str, tmp_path: Path, monkeypatch
) -> None:
    """The compiled what-if replay runs instances one after the other, NumPy level
    by level: marginal, alone and total costs of several culprits (a transfer
    culprit's cut included) must be the same numbers."""
    sc = next(s for s in SUITE if s.name == name)
    simulate_scenario(sc, tmp_path / name)
    run = ingest([tmp_path / name]).run()
    align(run)
    got = {}
    for native in ("1", "0"):
        monkeypatch.setenv("RANKWATCH_NATIVE", native)
        got[native] = ([f.to_dict() for f in detect(run)], run.meta["detect"]["total_cost_s"])
    assert got["1"] == got["0"]
    stragglers = [f for f in got["1"][0] if f["kind"] == "straggler"]
    assert len(stragglers) >= 2 and any(f["cost_s"] > 0 for f in stragglers)


@pytest.mark.parametrize("gapped", [False, True])
def test_cusum_is_the_same_doubles_as_numpy(monkeypatch, gapped: bool) -> None:
    """Clipped z steps of many groups with carried sums, excursions reaching 0
    exactly and not: S, and where each excursion began, identical."""
    rng = np.random.default_rng(3)
    n_groups = 300
    sizes = rng.integers(1, 40, n_groups)
    group = np.repeat(np.arange(n_groups), sizes)
    if gapped:  # group ids with gaps (not their own index)
        group = group * 3 + 1
    step = np.minimum(rng.standard_t(2, len(group)), 8.0) - 0.5
    step[rng.random(len(group)) < 0.1] = -0.5  # plain misses: S drops to 0 exactly
    carry = np.where(rng.random(group.max() + 1) < 0.5, rng.random(group.max() + 1) * 6, 0.0)
    at = np.arange(len(group))
    got = {}
    for native in ("1", "0"):
        monkeypatch.setenv("RANKWATCH_NATIVE", native)
        s, began_at = cusum_lazy(step, group, carry)
        got[native] = (s, began_at(at))
    assert np.array_equal(got["1"][0], got["0"][0]) and np.array_equal(got["1"][1], got["0"][1])
    assert (got["1"][0] == 0).any() and (got["1"][0] > 0).any()
    assert (got["1"][1] == -1).any() and (got["1"][1] >= 0).any()


def test_instances_match_numpy_however_numbered(monkeypatch) -> None:
    """Instances of uids spread over several steps, runs of one instance cut by
    others, NaN ends, prev uids found in the step, in another step only, or
    nowhere: per record, the instance's (uid, step, latest end) and the prev
    instance's (uid, step) agree (the kernel numbers instances its own way)."""
    from rankwatch.detect.cost import _instances_numpy

    rng = np.random.default_rng(9)
    n = 5000
    seg = np.sort(rng.integers(0, 12, n))
    uid = rng.integers(0, 400, n) * 7919
    gend = rng.random(n) * 1e6
    gend[rng.random(n) < 0.01] = np.nan
    prev_uid = np.where(rng.random(n) < 0.8, rng.integers(0, 500, n) * 7919, 0)
    fast = kernels.instances(uid, seg, gend, prev_uid)
    with np.errstate(invalid="ignore"):  # NaN ends: numpy.maximum's rule, kept
        ref = _instances_numpy(uid, seg, gend, prev_uid)
    assert fast is not None and fast[1] == ref[1]

    def canon(got):
        inst, _, i_seg, i_uid, i_end, prev = got
        me = np.c_[i_uid[inst], i_seg[inst], i_end[inst]]
        found = prev >= 0
        them = np.where(found[:, None], np.c_[i_uid[prev], i_seg[prev]], -1)
        return me, them

    (me_f, them_f), (me_r, them_r) = canon(fast), canon(ref)
    assert np.array_equal(me_f, me_r, equal_nan=True) and np.array_equal(them_f, them_r)
    assert (them_r[:, 0] == -1).any() and (them_r[:, 0] >= 0).any()
    assert np.isnan(me_r[:, 2]).any()


class _BothWays:
    """The straggler detector's per-(rank, slot) state (_slot_state) and per-rank
    runs (_rank_persistence) computed at every batch by the kernels and by NumPy
    from the same state: outputs and the state carried on must be equal (the
    records that may fire compared as sets: the kernel lists them in stream
    order, NumPy by slot)."""

    FIRED = ("rec", "run", "s", "run_start", "cusum_start", "z1", "carried")

    def __init__(self, monkeypatch) -> None:
        self.batches = self.candidates = self.rank_fired = self.heads = 0
        self.slot_state = straggler.StragglerDetector._slot_state
        self.rank = straggler.StragglerDetector._rank_persistence
        cls = straggler.StragglerDetector  # as methods: the detector comes first
        monkeypatch.setattr(cls, "_slot_state", lambda det, *a: self._slot(det, *a))
        monkeypatch.setattr(cls, "_rank_persistence", lambda det, *a: self._rank(det, *a))

    @staticmethod
    def _numpy(fn, *args):
        lib = kernels.library
        kernels.library = lambda: None
        try:
            return fn(*args)
        finally:
            kernels.library = lib

    def _slot(self, det, r, excess, sigma, thr, ok):
        arrays = det.grid.arrays
        before = {k: a.copy() for k, a in arrays.items()}
        fast = self.slot_state(det, r, excess, sigma, thr, ok)
        fast_state = {k: a.copy() for k, a in arrays.items()}
        for k, a in arrays.items():
            a[...] = before[k]
        ref = self._numpy(self.slot_state, det, r, excess, sigma, thr, ok)
        for k in ("resid", "hit", "head"):
            assert _same(fast[k], ref[k]), k
        fo, ro = np.argsort(fast["rec"], kind="stable"), np.argsort(ref["rec"], kind="stable")
        for k in self.FIRED:
            assert _same(fast[k][fo], ref[k][ro]), k
        for k, a in arrays.items():
            assert _same(fast_state[k], a), k
        self.batches += 1
        self.candidates += len(ref["rec"])
        self.heads += int(ref["head"].sum())
        return ref

    def _rank(self, det, r, judged, hit):
        """The kernel, NumPy at the hits, and NumPy sorting every op (the path for
        keys too wide for 63 bits): the same records fired and state carried."""
        before = (det.prun.copy(), det.miss.copy(), det.prun_at.copy())
        got = []
        for form in ("kernel", "hits", "sorted"):
            det.prun[...], det.miss[...], det.prun_at[...] = before
            if form == "kernel":
                fired = self.rank(det, r, judged, hit)
            elif form == "hits":
                fired = self._numpy(self.rank, det, r, judged, hit)
            else:
                keys = straggler._time_keys
                straggler._time_keys = lambda *a: None
                try:
                    fired = self._numpy(self.rank, det, r, judged, hit)
                finally:
                    straggler._time_keys = keys
            got.append(fired + (det.prun.copy(), det.miss.copy(), det.prun_at.copy()))
        for other in got[1:]:
            assert all(_same(a, b) for a, b in zip(got[0], other, strict=True))
        self.rank_fired += len(got[0][0])
        return got[0][:2]


_STRAGGLER_JOBS = {
    "host_and_gpu_8": Scenario(
        "host_and_gpu_8",
        SimConfig(ranks=8, hosts=2, steps=300, tp=2, seed=21, slow=SlowFault(3, 120, "host", 2000)),
        Extra(slow=(SlowFault(6, 200, "gpu", 1500),)),
    ),
    "heavy_noise_16": Scenario(
        "heavy_noise_16",
        SimConfig(ranks=16, hosts=2, steps=250, tp=4, seed=22, slow=SlowFault(9, 100, "gpu", 2000)),
        Extra(heavy_noise=True),
    ),
    "two_ranks": Scenario(
        "two_ranks", SimConfig(ranks=2, steps=400, seed=8, slow=SlowFault(1, 150, "gpu", 3000))
    ),
}


@pytest.mark.parametrize("name", list(_STRAGGLER_JOBS))
def test_straggler_state_matches_numpy_batch_by_batch(
    name: str, tmp_path: Path, monkeypatch
) -> None:
    simulate_scenario(_STRAGGLER_JOBS[name], tmp_path / name)
    run = ingest([tmp_path / name]).run()
    align(run)
    both = _BothWays(monkeypatch)
    # every late op fires the per-rank rule (six in a row, and off in pairs, by
    # default): so that its runs fire here, and are compared, as well as carried
    found = detect(run, batch=400, config=Config(persist_ops=1, pair_persist_ops=1))
    assert both.batches > 5 and both.heads > 0 and both.candidates > 0 and both.rank_fired > 0
    assert any(f.kind == "straggler" for f in found)


def test_straggler_kernels_decline_without_changing_state() -> None:
    """A (rank, slot) whose ops come out of seq order, an index out of range or a
    negative count: declined (None) before any state changed, for NumPy to do the
    batch; state arrays of the wrong size are a caller's error."""
    state = {k: np.zeros((2, 4) if k in ("nobs", "run", "cusum", "base", "last_z") else (2, 4, 4))
             for k in kernels.SLOT_STATE}  # fmt: skip
    for k in ("nobs", "run"):
        state[k] = state[k].astype(np.int64)
    state["nobs"][:] = 9  # past learning: every record would change run and cusum
    n = 3
    cols = {"flat": np.array([1, 1, 2]), "ok": np.ones(n, bool), "seq": np.array([5, 3, 1]),
            "excess": np.full(n, 1e6), "sigma": np.ones(n), "thr": np.ones(n),
            "comm": np.zeros(n), "func": np.zeros(n), "arrival_c": np.zeros(n)}  # fmt: skip
    before = {k: a.copy() for k, a in state.items()}
    assert kernels.slot_state(cols, state, 4, 6.0, 1.5, 2, 15.0) is None
    cols["seq"] = np.array([3, 5, 1])
    cols["flat"] = np.array([1, 1, 99])
    assert kernels.slot_state(cols, state, 4, 6.0, 1.5, 2, 15.0) is None
    cols["flat"] = np.array([1, 1, 2])
    state["nobs"][0, 2] = -1  # a count no detector makes: refused, not indexed with
    assert kernels.slot_state(cols, state, 4, 6.0, 1.5, 2, 15.0) is None
    state["nobs"][0, 2] = 9
    assert all(np.array_equal(before[k], state[k]) for k in state)
    with pytest.raises(ValueError, match="slot state 'learn'"):  # sized for another depth
        kernels.slot_state(cols, state, 5, 6.0, 1.5, 2, 15.0)
    got = kernels.slot_state(cols, state, 4, 6.0, 1.5, 2, 15.0)
    assert got is not None and got["hit"].all() and state["run"][0, 1] == 2
    run, miss = np.zeros(2, np.int64), np.zeros(2, np.int64)
    args = (np.array([0, 5]), np.array([0, 1]), np.zeros(2), np.ones(2, bool), np.zeros(2, bool))
    assert kernels.rank_runs(*args, 2, 2, run, miss) is None  # record 5 of 2
    assert run.tolist() == [0, 0] and miss.tolist() == [0, 0]


def test_top_two_matches_numpy(monkeypatch) -> None:
    """The latest and second-latest record of each instance: ties (the first wins),
    one-record instances, -inf (a GPU start never seen) and +inf, as NumPy finds them."""
    rng = np.random.default_rng(9)
    sizes = rng.integers(1, 9, 400)
    start = np.cumsum(sizes) - sizes
    g = rng.integers(0, 6, sizes.sum()).astype(float)  # few values: many ties
    g[rng.random(len(g)) < 0.1] = -np.inf
    g[rng.random(len(g)) < 0.02] = np.inf
    inst = np.repeat(np.arange(len(sizes)), sizes)
    got = {}
    for native in ("1", "0"):
        monkeypatch.setenv("RANKWATCH_NATIVE", native)
        got[native] = blame._top_two(g, inst, start)
    assert all(np.array_equal(a, b) for a, b in zip(got["1"], got["0"], strict=True))
    last, second = got["1"]
    assert (second == last).any() and (second != last).any()
    assert kernels.top_two(g, np.array([0, 5, 3])) is None  # instances out of order
