"""The detectors' evaluation suite: simulated jobs with known faults, and scoring.

The simulator injects one slow rank, one hang and one desync per job. The
suite also needs several stragglers at once, rotating small delays, pipeline
stage imbalance, ranks always late by the same amount, heavy noise and the
other hang classes; `Extra` describes those and `_engine_class` applies them
by overriding the simulator Engine's fault hooks while `simulate` runs in this
process (workers=1). A simulator that takes lists of faults would make this
module a list of configs.

Used by tests/detect/test_suite.py (small jobs, CI) and bench/detect_eval.py
(adds large jobs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from rankwatch.align import align
from rankwatch.detect import detect
from rankwatch.model import Finding
from rankwatch.simulate import DesyncFault, HangFault, SimConfig, SlowFault, simulate
from rankwatch.simulate import timeline as sim_timeline
from rankwatch.simulate import writer as sim_writer
from rankwatch.simulate.records import rank_slots
from rankwatch.simulate.timeline import STEP_START_HOST_US, Engine, InFlight, Noise
from rankwatch.simulate.writer import Job
from rankwatch.store import ingest

# ----------------------------------------------------------------- faults beyond SimConfig


@dataclass(frozen=True)
class Rotating:
    """From `from_step` on, one rank per step is late by `us` (cause host or gpu):
    in turn (`cycle`, a random order each round) or at random (`random`)."""

    us: float
    cause: str = "host"
    from_step: int = 0
    order: str = "cycle"


@dataclass(frozen=True)
class Extra:
    slow: tuple[SlowFault, ...] = ()  # stragglers beyond cfg.slow
    rotating: Rotating | None = None
    stage_compute: tuple[float, ...] = ()  # compute factor per pipeline stage (expected)
    fixed_late_us: tuple[tuple[int, float, str], ...] = ()  # (rank, us, cause) from step 0
    heavy_noise: bool = False
    hang_class: str = "not_enqueued"  # how cfg.hang's rank hangs
    # (rank, us, cause, from_step, to_step): slow only in [from_step, to_step)
    bursts: tuple[tuple[int, float, str, int, int], ...] = ()


class HeavyNoise(Noise):
    """Twice the host jitter, five times the compute jitter, ten times more outliers."""

    @classmethod
    def draw(cls, rng, steps, phases, n):  # noqa: ANN001 - as Noise.draw
        shape = (steps, phases, n)
        tail = 1.0 + np.minimum(rng.pareto(2.5, size=shape), 20.0)
        return cls(
            host=rng.lognormal(0.0, 0.5, shape),
            compute=rng.lognormal(0.0, 0.05, shape) * np.where(rng.random(shape) < 0.01, tail, 1.0),
            enqueue=rng.lognormal(0.0, 0.4, shape),
            end_jitter=rng.exponential(2000.0, shape),
            transfer=rng.lognormal(0.0, 0.1, shape)
            * np.where(
                rng.random(shape) < 0.01, 1.0 + np.minimum(rng.pareto(2.5, size=shape), 20.0), 1.0
            ),
        )


def _rotation(extra: Extra, cfg: SimConfig) -> np.ndarray:
    """Rank delayed at each step by the rotating fault (-1: none)."""
    rot = extra.rotating
    out = np.full(cfg.steps, -1)
    if rot is None:
        return out
    rng = np.random.default_rng([cfg.seed, 99])
    steps = np.arange(rot.from_step, cfg.steps)
    if rot.order == "random":
        out[steps] = rng.integers(0, cfg.ranks, len(steps))
    else:
        rounds = -(-len(steps) // cfg.ranks)
        out[steps] = np.concatenate([rng.permutation(cfg.ranks) for _ in range(rounds)])[
            : len(steps)
        ]
    return out


def _engine_class(extra: Extra) -> type[Engine]:
    class ExtEngine(Engine):
        def __init__(self, cfg, layout, phases):  # noqa: ANN001 - as Engine
            super().__init__(cfg, layout, phases)
            self.rotation = _rotation(extra, cfg)
            stage = layout.comm_rank["pp"] if "pp" in layout.comms else np.zeros(layout.n, int)
            factors = np.array(extra.stage_compute or (1.0,))
            self.stage_factor = factors[np.minimum(stage, len(factors) - 1)]

        def _extra_us(self, cause: str, step: int) -> np.ndarray:
            us = np.zeros(self.layout.n)
            faults = list(extra.slow) + ([self.cfg.slow] if self.cfg.slow else [])
            for f in faults:
                if f.cause == cause and step >= f.from_step:
                    us[f.rank] += f.us
            for rank, late, c in extra.fixed_late_us:
                if c == cause:
                    us[rank] += late
            for rank, late, c, begin, end in extra.bursts:
                if c == cause and begin <= step < end:
                    us[rank] += late
            rot = extra.rotating
            if rot is not None and rot.cause == cause and self.rotation[step] >= 0:
                us[self.rotation[step]] += rot.us
            return us

        def _host_side(self, plan, p, s, step, noise):  # noqa: ANN001 - as Engine
            n = self.layout.n
            stall = STEP_START_HOST_US * 1e3 * noise.host[s, p] if p == 0 else np.zeros(n)
            if p == 0:
                stall = stall + self._extra_us("host", step) * 1e3
            launch = self.clocks.host_t + stall
            api = launch + plan.phase.host_us * 1e3 * noise.host[s, p]
            enq_s = api + 1500.0 * noise.enqueue[s, p]
            enq_e = enq_s + 6000.0 * noise.enqueue[s, p]
            self.clocks.host_t = enq_e + 1000.0
            return launch, api, enq_s, enq_e

        def _gpu_start(self, plan, p, s, step, noise, launch, enq_e):  # noqa: ANN001
            compute = plan.phase.compute_us * 1e3 * noise.compute[s, p] * self.stage_factor
            if p == 0:
                compute = compute + self._extra_us("gpu", step) * 1e3
            ready = np.maximum(self.clocks.gpu_free, launch + 5000.0) + compute
            return np.maximum(ready, enq_e + 4000.0)

        def _slow_transfer(self, plan, step):  # noqa: ANN001
            us = self._extra_us("transfer", step)
            if not us.any():
                return 0.0
            if plan.send_to is None:
                per_group = np.zeros(plan.groups)
                np.maximum.at(per_group, plan.group_of, us)
                return per_group * 1e3
            return (
                np.maximum(us, np.where(plan.send_to >= 0, us[np.maximum(plan.send_to, 0)], 0))
                * 1e3
            )

        def _hang_state(self, step):  # noqa: ANN001
            state = super()._hang_state(step)
            if state is None or extra.hang_class == "not_enqueued":
                return state
            rank = self.cfg.hang.rank
            state.issuing[:] = True
            if extra.hang_class == "enqueued_not_started":
                state.blocked[rank] = True
            state.network_rank = rank if extra.hang_class == "started_not_finished" else -1
            return state

        def _apply_hang(self, plan, p, hang, api, gs, ends):  # noqa: ANN001
            rank = getattr(hang, "network_rank", -1)
            if rank < 0 or plan.send_to is not None:
                return super()._apply_hang(plan, p, hang, api, gs, ends)
            stuck = plan.group_of == plan.group_of[rank]
            for r in np.flatnonzero(stuck):
                hang.in_flight.append(InFlight(int(r), p, "coll", float(api[r]), float(gs[r])))
            ends[0][stuck] = np.nan
            hang.blocked |= stuck
            hang.network_rank = -1
            return None

    return ExtEngine


@contextlib.contextmanager
def _patched(extra: Extra | None) -> Iterator[None]:
    if extra is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(sim_writer, "Engine", _engine_class(extra)))
        if extra.heavy_noise:
            stack.enter_context(mock.patch.object(sim_timeline, "Noise", HeavyNoise))
        yield


# ----------------------------------------------------------------- scenarios and truth


@dataclass(frozen=True)
class Expect:
    kind: str
    rank: int | None
    cause: str
    comm: str  # communicator id where it starts
    seq: int
    per_step: int = 1  # ops of that communicator and function per step


@dataclass(frozen=True)
class Scenario:
    name: str
    cfg: SimConfig
    extra: Extra | None = None
    note: str = ""
    low_snr: bool = False  # a delay below the per-op threshold: found by CUSUM, slower

    def faults(self) -> list[SlowFault]:
        extra = list(self.extra.slow) if self.extra else []
        return ([self.cfg.slow] if self.cfg.slow else []) + extra


def _first_op(job: Job, rank: int, step: int) -> tuple[str, int, int]:
    slot = rank_slots(job.layout, job.phases, rank)[0]
    phase = job.phases[slot.phase_index]
    comm = job.layout.comm_of(phase.comm, rank)
    return comm.id_str, step * slot.seq_per_step + slot.seq_in_step, slot.seq_per_step


def expected(sc: Scenario, truth: dict[str, Any]) -> list[Expect]:
    job = Job.build(sc.cfg)
    out = []
    for f in sc.faults():
        comm, seq, per_step = _first_op(job, f.rank, f.from_step)
        out.append(Expect("straggler", f.rank, f.cause, comm, seq, per_step))
    for t in truth["faults"]:
        if t["kind"] == "hang":
            cls = sc.extra.hang_class if sc.extra else "not_enqueued"
            op = t["first_missing_op"]
            rank = None if cls == "started_not_finished" else t["rank"]
            out.append(Expect("hang", rank, cls, op["comm_id"], op["seq"]))
        elif t["kind"] == "desync":
            out.append(Expect("desync", t["rank"], t["desync_kind"], t["comm_id"], t["seq"]))
    return out


def true_cost_s(sc: Scenario) -> float | None:
    """Job time the stragglers cost: the same job (same noise) with and without them."""
    if not sc.faults() or sc.cfg.hang is not None:
        return None
    clean_extra = dataclasses.replace(sc.extra or Extra(), slow=())
    ends = []
    for cfg, extra in (
        (sc.cfg, sc.extra or Extra()),
        (dataclasses.replace(sc.cfg, slow=None), clean_extra),
    ):
        job = Job.build(cfg)
        with _patched(extra):
            engine = sim_writer.Engine(cfg, job.layout, job.phases)
            ends.append(engine.run_chunk(0, cfg.steps).end_time)
    return (ends[0] - ends[1]) / 1e9


# ----------------------------------------------------------------- running and scoring


@dataclass
class Result:
    scenario: Scenario
    expected: list[Expect]
    findings: list[Finding]
    seconds: dict[str, float]
    records: int
    first_stall_ns: int | None = None  # hangs: first progress record after the last op ended
    total_cost_s: float | None = None  # what-if with every straggler's delays removed
    true_cost_s: float | None = None  # the same job simulated without the stragglers
    matched: list[tuple[Expect, Finding | None]] = field(default_factory=list)
    false: list[Finding] = field(default_factory=list)


def simulate_scenario(sc: Scenario, out: Path):  # noqa: ANN201 - simulate's result
    """The scenario's records in out (its extras patched into the simulator)."""
    with _patched(sc.extra):
        return simulate(dataclasses.replace(sc.cfg, workers=1) if sc.extra else sc.cfg, out)


def run_scenario(sc: Scenario, workdir: Path) -> Result:
    out = workdir / sc.name
    t0 = time.perf_counter()
    res = simulate_scenario(sc, out)
    t1 = time.perf_counter()
    run = ingest([out]).run()
    clock = align(run)
    t2 = time.perf_counter()
    findings = detect(run, clock)
    t3 = time.perf_counter()
    stall = None
    if sc.cfg.hang is not None:
        stall = run.con.execute(
            "SELECT min(ts_ns) FROM progress WHERE in_flight_count > 0 AND ts_ns > "
            "(SELECT max(gpu_end_ns) FROM ops)"
        ).fetchall()[0][0]
    result = Result(
        sc,
        expected(sc, res.truth),
        findings,
        {"simulate": t1 - t0, "ingest_align": t2 - t1, "detect": t3 - t2},
        res.op_records,
        stall,
        run.meta["detect"]["total_cost_s"],
        true_cost_s(sc),
    )
    score(result)
    return result


def _matches(e: Expect, f: Finding) -> bool:
    if f.kind != e.kind:
        return False
    if e.rank is None:
        return f.rank is None and f.comm is not None and f.comm.id == e.comm
    return f.rank == e.rank


def score(result: Result) -> None:
    left = list(result.findings)
    for e in result.expected:
        hit = next((f for f in left if _matches(e, f)), None)
        if hit is not None:
            left.remove(hit)
        result.matched.append((e, hit))
    result.false = left


def delay(e: Expect, f: Finding) -> float | None:
    """Stragglers: collectives from the true onset to detection (same communicator);
    hangs and desyncs: None here (see hang_delay_s)."""
    if e.kind != "straggler":
        return None
    det = f.evidence.get("detected_at", {})
    if f.comm is None or f.comm.id != e.comm:
        return float("inf")
    return float(det.get("seq", f.since.seq) - e.seq)


def hang_delay_s(result: Result, f: Finding) -> float | None:
    det = f.evidence.get("detected_at_ns")
    if det is None or result.first_stall_ns is None:
        return None
    return (det - result.first_stall_ns) / 1e9


FLOORS = {"precision": 0.99, "recall": 0.99, "culprit": 1.0, "cause": 0.95, "onset": 0.95}
# A straggler late once per step is confirmed at its second late step (one step after
# onset) when two in a row are unlikely to be chance (Config.chance_runs), else at its
# third; one late at every op, at its third op. Below the per-op threshold (low SNR)
# the CUSUM takes longer.
MAX_DELAY_STEPS = 2.0
MAX_DELAY_MEDIAN_COLLECTIVES = 8.0
# scenarios whose stragglers are all confirmed within 10 collectives of their onset
MIN_WITHIN_10_COLLECTIVES = 1.0
MAX_LOW_SNR_DELAY_STEPS = 12.0
MAX_HANG_DELAY_S = 2.0
MAX_COST_ERROR = 0.35  # |what-if - true| / true, total over a scenario's stragglers


def row(result: Result) -> dict[str, Any]:
    m = [(e, f) for e, f in result.matched if f is not None]
    delays = [delay(e, f) for e, f in m if e.kind == "straggler"]
    steps = [delay(e, f) / e.per_step for e, f in m if e.kind == "straggler"]
    hang = [hang_delay_s(result, f) for e, f in m if e.kind == "hang"]
    culprits_ok = len(m) == len(result.expected) and not any(
        f.rank is not None for f in result.false
    )
    cost = [f.cost_s or 0.0 for e, f in m if e.kind == "straggler"]
    return {
        "scenario": result.scenario.name,
        "ranks": result.scenario.cfg.ranks,
        "records": result.records,
        "expected": len(result.expected),
        "found": len(result.findings),
        "true_pos": len(m),
        "false_pos": len(result.false),
        "culprit_ok": culprits_ok,
        "cause_ok": sum(f.cause == e.cause for e, f in m),
        "onset_ok": sum(f.since is not None and f.since.seq == e.seq for e, f in m),
        "delay_max": max((d for d in delays if d is not None), default=None),
        "delay_steps": max(steps, default=None),
        "low_snr": result.scenario.low_snr,
        "hang_delay_s": max((d for d in hang if d is not None), default=None),
        "cost_s": result.total_cost_s if cost else None,
        "true_cost_s": result.true_cost_s,
        "detect_s": result.seconds["detect"],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    found = sum(r["found"] for r in rows)
    tp = sum(r["true_pos"] for r in rows)
    exp = sum(r["expected"] for r in rows)
    delays = [r["delay_max"] for r in rows if r["delay_max"] is not None and not r["low_snr"]]
    steps = [r["delay_steps"] for r in rows if r["delay_steps"] is not None and not r["low_snr"]]
    low = [r["delay_steps"] for r in rows if r["delay_steps"] is not None and r["low_snr"]]
    costs = [
        (r["cost_s"], r["true_cost_s"])
        for r in rows
        if r["cost_s"] is not None and r["true_cost_s"] and not r["low_snr"]
    ]
    hangs = [r["hang_delay_s"] for r in rows if r["hang_delay_s"] is not None]
    healthy = [r for r in rows if r["expected"] == 0]
    return {
        "scenarios": len(rows),
        "precision": tp / found if found else 1.0,
        "recall": tp / exp if exp else 1.0,
        "culprit": sum(r["culprit_ok"] for r in rows) / len(rows),
        "cause": sum(r["cause_ok"] for r in rows) / tp if tp else 1.0,
        "onset": sum(r["onset_ok"] for r in rows) / tp if tp else 1.0,
        "delay_max_collectives": max(delays, default=0.0),
        "delay_median_collectives": float(np.median(delays)) if delays else 0.0,
        "within_10_collectives": sum(d <= 10 for d in delays) / len(delays) if delays else 1.0,
        "delay_max_steps": max(steps, default=0.0),
        "low_snr_delay_max_steps": max(low, default=0.0),
        "cost_error_max": max((abs(c - t) / t for c, t in costs), default=0.0),
        "hang_delay_max_s": max(hangs, default=0.0),
        "healthy_with_findings": sum(r["found"] > 0 for r in healthy),
        "records": sum(r["records"] for r in rows),
        "detect_s": sum(r["detect_s"] for r in rows),
    }


def failures(s: dict[str, Any]) -> list[str]:
    """The floors s falls below (the suite's and the large set's alike)."""
    out = [f"{k} {s[k]:.3f} < {v}" for k, v in FLOORS.items() if s[k] < v]
    if s["delay_max_steps"] > MAX_DELAY_STEPS:
        out.append(f"detection delay {s['delay_max_steps']} > {MAX_DELAY_STEPS} steps")
    if s["delay_median_collectives"] > MAX_DELAY_MEDIAN_COLLECTIVES:
        out.append(
            f"median detection delay {s['delay_median_collectives']} > "
            f"{MAX_DELAY_MEDIAN_COLLECTIVES} collectives"
        )
    if s["within_10_collectives"] < MIN_WITHIN_10_COLLECTIVES:
        out.append(
            f"stragglers confirmed within 10 collectives in {s['within_10_collectives']:.2f} "
            f"of scenarios < {MIN_WITHIN_10_COLLECTIVES}"
        )
    if s["low_snr_delay_max_steps"] > MAX_LOW_SNR_DELAY_STEPS:
        out.append(
            f"low-SNR detection delay {s['low_snr_delay_max_steps']} > "
            f"{MAX_LOW_SNR_DELAY_STEPS} steps"
        )
    if s["cost_error_max"] > MAX_COST_ERROR:
        out.append(f"what-if cost off by {s['cost_error_max']:.0%} > {MAX_COST_ERROR:.0%}")
    if s["hang_delay_max_s"] > MAX_HANG_DELAY_S:
        out.append(f"hang detection delay {s['hang_delay_max_s']:.2f} s > {MAX_HANG_DELAY_S} s")
    if s["healthy_with_findings"]:
        out.append(f"{s['healthy_with_findings']} healthy scenario(s) with findings")
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "scenario",
        "ranks",
        "exp",
        "found",
        "tp",
        "fp",
        "culprit",
        "cause",
        "onset",
        "delay_coll",
        "delay_steps",
        "hang_s",
        "cost_s",
        "true_cost_s",
        "detect_s",
    )
    keys = (
        "scenario",
        "ranks",
        "expected",
        "found",
        "true_pos",
        "false_pos",
        "culprit_ok",
        "cause_ok",
        "onset_ok",
        "delay_max",
        "delay_steps",
        "hang_delay_s",
        "cost_s",
        "true_cost_s",
        "detect_s",
    )

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "ok" if v else "WRONG"
        if isinstance(v, float):
            return f"{v:.3f}"
        return "-" if v is None else str(v)

    cells = [head] + [tuple(fmt(r[k]) for k in keys) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(head))) for c in cells]
    s = summary(rows)
    lines.append("")
    lines.append(
        f"precision {s['precision']:.3f}  recall {s['recall']:.3f}  culprit {s['culprit']:.3f}  "
        f"cause {s['cause']:.3f}  onset {s['onset']:.3f}\n"
        f"delay max {s['delay_max_collectives']:.0f} collectives / "
        f"{s['delay_max_steps']:.1f} steps "
        f"(median {s['delay_median_collectives']:.0f} collectives, within 10 in "
        f"{s['within_10_collectives']:.0%} of scenarios; low SNR max "
        f"{s['low_snr_delay_max_steps']:.1f} steps)  hang delay max {s['hang_delay_max_s']:.2f} s  "
        f"what-if cost error max {s['cost_error_max']:.0%}  healthy with findings "
        f"{s['healthy_with_findings']}\n"
        f"{s['scenarios']} scenarios, {s['records']} records, detect {s['detect_s']:.1f} s"
    )
    return "\n".join(lines)


def to_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps({"rows": rows, "summary": summary(rows)}, indent=1, default=str)


# ----------------------------------------------------------------- the suite

H2 = {"hosts": 2, "clock_offset_us": 5000.0, "drift_ppm": 10.0}


def _cfg(ranks: int, steps: int, seed: int, **kw: Any) -> SimConfig:
    base = {**H2, **kw}
    return SimConfig(ranks=ranks, steps=steps, seed=seed, workers=1, **base)


SUITE: list[Scenario] = [
    # healthy: must not fire
    Scenario("healthy_8", _cfg(8, 60, 11)),
    Scenario("healthy_tp_pp_16", _cfg(16, 50, 12, tp=2, pp=2)),
    Scenario("healthy_noise_8", _cfg(8, 60, 13), Extra(heavy_noise=True)),
    Scenario("healthy_noise_tp_pp_16", _cfg(16, 50, 14, tp=2, pp=2), Extra(heavy_noise=True)),
    # a long job with rare heavy stalls (1 % of ops, up to 20x): two in a row at one op
    # of one rank happen here by chance, so two late steps must not fire once such
    # stalls have been seen (Config.chance_runs)
    Scenario("healthy_noise_long_8", _cfg(8, 1200, 43), Extra(heavy_noise=True)),
    Scenario("healthy_4hosts_tp4_32", _cfg(32, 40, 15, tp=4, hosts=4)),
    Scenario("rotating_host_8", _cfg(8, 60, 16), Extra(rotating=Rotating(700, "host"))),
    Scenario("rotating_gpu_tp_16", _cfg(16, 50, 17, tp=2), Extra(rotating=Rotating(700, "gpu"))),
    Scenario(
        "rotating_random_64",
        _cfg(64, 30, 18, tp=4, hosts=8),
        Extra(rotating=Rotating(700, "gpu", order="random")),
    ),
    Scenario("stage_imbalance_16", _cfg(16, 50, 19, tp=2, pp=2), Extra(stage_compute=(1.0, 1.3))),
    Scenario(
        "stage_imbalance_pp4_16", _cfg(16, 50, 20, pp=4), Extra(stage_compute=(1.0, 1.0, 1.0, 1.4))
    ),
    Scenario(
        "fixed_order_8",
        _cfg(8, 60, 21),
        Extra(fixed_late_us=((3, 500.0, "host"), (6, 400.0, "gpu"))),
    ),
    # stragglers
    Scenario("slow_host_late_8", _cfg(8, 60, 22, slow=SlowFault(5, 40, "host", 3000))),
    Scenario("slow_host_early_8", _cfg(8, 50, 23, slow=SlowFault(1, 6, "host", 1500))),
    Scenario("slow_gpu_8", _cfg(8, 60, 24, slow=SlowFault(2, 30, "gpu", 2000))),
    Scenario(
        "slow_gpu_tp_seen_from_dp_16",
        _cfg(16, 50, 25, tp=2, pp=2, slow=SlowFault(5, 30, "gpu", 2000)),
        note="a slow TP rank: its DP peers wait, only it is reported",
    ),
    Scenario(
        "slow_gpu_small_tp4_32", _cfg(32, 40, 26, tp=4, hosts=4, slow=SlowFault(13, 20, "gpu", 800))
    ),
    Scenario("slow_transfer_tp_8", _cfg(8, 50, 27, tp=2, slow=SlowFault(2, 30, "transfer", 1000))),
    Scenario(
        "slow_transfer_early_tp_pp_16",
        _cfg(16, 40, 28, tp=2, pp=2, slow=SlowFault(6, 8, "transfer", 800)),
    ),
    Scenario(
        "slow_transfer_tp4_32",
        _cfg(32, 40, 29, tp=4, hosts=4, slow=SlowFault(17, 25, "transfer", 600)),
    ),
    Scenario(
        "two_host_gpu_16",
        _cfg(16, 50, 30, tp=2, slow=SlowFault(3, 20, "host", 2000)),
        Extra(slow=(SlowFault(12, 35, "gpu", 1500),)),
    ),
    Scenario(
        "three_stragglers_8",
        _cfg(8, 60, 31, slow=SlowFault(1, 15, "gpu", 1500)),
        Extra(slow=(SlowFault(4, 25, "host", 2500), SlowFault(6, 35, "gpu", 1000))),
        note="rank 6's 1 ms is 5 sigma of its 20 ms segment's jitter",
        low_snr=True,
    ),
    Scenario(
        "straggler_with_rotating_16",
        _cfg(16, 50, 32, tp=2, slow=SlowFault(9, 30, "gpu", 2000)),
        Extra(rotating=Rotating(700, "host")),
    ),
    Scenario(
        "straggler_heavy_noise_8",
        _cfg(8, 60, 33, slow=SlowFault(4, 30, "gpu", 3000)),
        Extra(heavy_noise=True),
        note="3 ms is ~3 sigma of heavy noise",
        low_snr=True,
    ),
    Scenario(
        "straggler_in_imbalanced_pipeline_16",
        _cfg(16, 50, 34, tp=2, pp=2, slow=SlowFault(10, 25, "host", 2000)),
        Extra(stage_compute=(1.0, 1.3)),
    ),
    Scenario(
        "gpu_and_transfer_16",
        _cfg(16, 50, 35, tp=2, slow=SlowFault(2, 20, "gpu", 2000)),
        Extra(slow=(SlowFault(9, 30, "transfer", 1000),)),
    ),
    Scenario(
        "slow_gpu_tp8_64", _cfg(64, 30, 36, tp=8, hosts=8, slow=SlowFault(37, 15, "gpu", 1500))
    ),
    # hangs
    Scenario("hang_not_enqueued_tp_8", _cfg(8, 40, 37, tp=2, hang=HangFault(3, 20))),
    Scenario("hang_not_enqueued_tp_pp_16", _cfg(16, 30, 38, tp=2, pp=2, hang=HangFault(9, 15))),
    Scenario(
        "hang_gpu_stuck_8",
        _cfg(8, 40, 39, tp=2, hang=HangFault(5, 20)),
        Extra(hang_class="enqueued_not_started"),
    ),
    Scenario(
        "hang_network_8",
        _cfg(8, 40, 40, tp=2, hang=HangFault(6, 20)),
        Extra(hang_class="started_not_finished"),
    ),
    # desyncs
    Scenario("desync_size_8", _cfg(8, 30, 41, desync=DesyncFault(6, 10, "size"))),
    Scenario("desync_func_tp_8", _cfg(8, 30, 42, tp=2, desync=DesyncFault(6, 10, "func"))),
    Scenario(
        "desync_size_tp_pp_16", _cfg(16, 30, 43, tp=2, pp=2, desync=DesyncFault(4, 12, "size"))
    ),
]
