"""When every op of a simulated job happens, in true (reference) time.

Per rank there is a host timeline (API calls, run ahead of the GPU) and a GPU
timeline (compute, then the collective kernel). A collective's kernel starts
on each rank when that rank's GPU gets to it, and ends on every member shortly
after the last member started plus the transfer time. At the end of a step
every host waits for its GPU (loss.item()), so steps start in sync.

Times are float64 nanoseconds since the job start; all ranks at once with
numpy, one phase at a time (the recurrence over phases is inherently serial).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwatch.simulate.config import SimConfig
from rankwatch.simulate.topology import Layout, Phase

STEP_START_HOST_US = 300.0  # data loading before the first op of a step
STEP_END_SYNC_US = 20.0


@dataclass
class PhaseTimes:
    """One phase over a chunk of steps; arrays of shape (steps, ranks); NaN = no op."""

    api_start: np.ndarray
    enq_start: np.ndarray
    enq_end: np.ndarray
    gpu_start: np.ndarray
    end: np.ndarray  # collective end, or the send's end for p2p
    recv_end: np.ndarray | None = None  # p2p only: the receive's end


@dataclass
class InFlight:
    """An op issued but never completed (hang)."""

    rank: int
    phase: int
    part: str  # "coll", "send" or "recv"
    arrival: float
    gpu_start: float | None


@dataclass
class Chunk:
    first_step: int
    steps: int
    phases: list[PhaseTimes]
    in_flight: list[InFlight] = field(default_factory=list)
    end_time: float = 0.0  # true time when the chunk's last op completed


@dataclass
class Clocks:
    """Host state carried from one phase (and chunk) to the next."""

    host_t: np.ndarray
    gpu_free: np.ndarray


def transfer_us(phase: Phase, n: int, nnodes: int) -> float:
    """Time to move the data once every member has started (alpha-beta model)."""
    lat, busbw = (6.0, 180e3) if nnodes <= 1 else (18.0, 40e3)  # us, bytes/us
    if phase.p2p_dir:
        return lat + phase.msg_bytes / busbw
    factor = {"AllReduce": 2.0 * (n - 1) / n, "AllGather": (n - 1.0), "ReduceScatter": (n - 1.0)}
    return lat + phase.msg_bytes * factor.get(phase.func, 1.0) / busbw


def _heavy_tail(rng: np.random.Generator, shape: tuple[int, ...], p: float) -> np.ndarray:
    """1 mostly; with probability p a Pareto-distributed multiplier (a rare slow op)."""
    tail = 1.0 + np.minimum(rng.pareto(2.5, size=shape), 20.0)
    return np.where(rng.random(shape) < p, tail, 1.0)


@dataclass
class Noise:
    """Random draws for a chunk: (steps, phases, ranks), transfer (steps, phases, groups)."""

    host: np.ndarray
    compute: np.ndarray
    enqueue: np.ndarray
    end_jitter: np.ndarray
    transfer: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator, steps: int, phases: int, n: int) -> Noise:
        shape = (steps, phases, n)
        return cls(
            host=rng.lognormal(0.0, 0.25, shape),
            compute=rng.lognormal(0.0, 0.01, shape) * _heavy_tail(rng, shape, 0.001),
            enqueue=rng.lognormal(0.0, 0.2, shape),
            end_jitter=rng.exponential(700.0, shape),
            transfer=rng.lognormal(0.0, 0.04, (steps, phases, n))
            * _heavy_tail(rng, (steps, phases, n), 0.003),
        )


@dataclass
class PhasePlan:
    """What a phase needs at run time, computed once: groups and base transfer times."""

    phase: Phase
    perm: np.ndarray  # ranks ordered by group, reshapeable to (groups, size)
    group_of: np.ndarray  # (N,)
    groups: int
    transfer_ns: np.ndarray  # (groups,) collectives; (N,) per sender for p2p
    send_to: np.ndarray | None = None  # (N,) peer a rank sends to, -1 for none
    slow_group: np.ndarray | None = None  # (groups,) or (N,) involves the slow rank


def _p2p_peers(layout: Layout, direction: int) -> np.ndarray:
    stage = layout.comm_rank["pp"]
    stride = layout.cfg.tp * layout.cfg.dp_size
    r = np.arange(layout.n)
    nxt = np.where(stage < layout.cfg.pp - 1, r + stride, -1)
    prv = np.where(stage > 0, r - stride, -1)
    return nxt if direction > 0 else prv


def plan_phase(phase: Phase, layout: Layout) -> PhasePlan:
    group_of = layout.group_of[phase.comm]
    perm = np.argsort(group_of, kind="stable")
    comms = layout.comms[phase.comm]
    slow = layout.cfg.slow
    slow_rank = slow.rank if slow is not None and slow.cause == "transfer" else -1
    if phase.p2p_dir:
        send_to = _p2p_peers(layout, phase.p2p_dir)
        same_host = layout.host_of == layout.host_of[np.maximum(send_to, 0)]
        ns = np.array([transfer_us(phase, 2, 1 if s else 2) * 1e3 for s in same_host])
        involved = (np.arange(layout.n) == slow_rank) | (send_to == slow_rank)
        return PhasePlan(phase, perm, group_of, len(comms), ns, send_to, involved)
    ns = np.array([transfer_us(phase, len(c.ranks), c.nnodes) * 1e3 for c in comms])
    involved = np.array([slow_rank in c.ranks for c in comms])
    return PhasePlan(phase, perm, group_of, len(comms), ns, None, involved)


@dataclass
class HangState:
    """During the hang step: who issues ops, whose GPU stream is stuck."""

    issuing: np.ndarray  # (N,) bool
    blocked: np.ndarray  # (N,) bool
    in_flight: list[InFlight] = field(default_factory=list)


class Engine:
    """Runs the job chunk by chunk; deterministic for a given config and seed."""

    def __init__(self, cfg: SimConfig, layout: Layout, phases: list[Phase]) -> None:
        self.cfg, self.layout, self.phases = cfg, layout, phases
        self.plans = [plan_phase(p, layout) for p in phases]
        zeros = np.zeros(layout.n)
        self.clocks = Clocks(host_t=zeros.copy(), gpu_free=zeros.copy())
        self.finished = False

    def run_chunk(self, first_step: int, steps: int) -> Chunk:
        n, count = self.layout.n, len(self.phases)
        rng = np.random.default_rng([self.cfg.seed, 7, first_step])
        noise = Noise.draw(rng, steps, count, n)
        arrays = [_empty_phase(steps, n, plan) for plan in self.plans]
        chunk = Chunk(first_step, steps, arrays)
        for s in range(steps):
            step = first_step + s
            hang = self._hang_state(step)
            for p, plan in enumerate(self.plans):
                self._run_phase(plan, p, s, step, noise, arrays[p], hang)
            if hang is not None:
                chunk.in_flight, chunk.steps, self.finished = hang.in_flight, s + 1, True
                break
            self._sync_step_end()
        chunk.end_time = float(np.nanmax(self.clocks.host_t))
        return chunk

    def _hang_state(self, step: int) -> HangState | None:
        hang = self.cfg.hang
        if hang is None or step != hang.at_step:
            return None
        issuing = np.arange(self.layout.n) != hang.rank
        return HangState(issuing, np.zeros(self.layout.n, dtype=bool))

    def _sync_step_end(self) -> None:
        c = self.clocks
        c.host_t = np.maximum(c.host_t, c.gpu_free) + STEP_END_SYNC_US * 1e3

    def _host_side(self, plan: PhasePlan, p: int, s: int, step: int, noise: Noise):
        """API and enqueue times, and when the op's preceding compute was launched."""
        stall = STEP_START_HOST_US * 1e3 * noise.host[s, p] if p == 0 else np.zeros(self.layout.n)
        slow = self.cfg.slow
        if slow is not None and slow.cause == "host" and p == 0 and step >= slow.from_step:
            stall[slow.rank] += slow.us * 1e3
        launch = self.clocks.host_t + stall
        api = launch + plan.phase.host_us * 1e3 * noise.host[s, p]
        enq_s = api + 1500.0 * noise.enqueue[s, p]
        enq_e = enq_s + 6000.0 * noise.enqueue[s, p]
        self.clocks.host_t = enq_e + 1000.0
        return launch, api, enq_s, enq_e

    def _gpu_start(self, plan: PhasePlan, p: int, s: int, step: int, noise, launch, enq_e):
        compute = plan.phase.compute_us * 1e3 * noise.compute[s, p]
        slow = self.cfg.slow
        if slow is not None and slow.cause == "gpu" and p == 0 and step >= slow.from_step:
            compute[slow.rank] += slow.us * 1e3
        ready = np.maximum(self.clocks.gpu_free, launch + 5000.0) + compute
        return np.maximum(ready, enq_e + 4000.0)

    def _slow_transfer(self, plan: PhasePlan, step: int) -> np.ndarray | float:
        slow = self.cfg.slow
        if slow is None or slow.cause != "transfer" or step < slow.from_step:
            return 0.0
        return np.where(plan.slow_group, slow.us * 1e3, 0.0)

    def _run_phase(self, plan, p, s, step, noise, out: PhaseTimes, hang) -> None:
        launch, api, enq_s, enq_e = self._host_side(plan, p, s, step, noise)
        gs = self._gpu_start(plan, p, s, step, noise, launch, enq_e)
        extra = self._slow_transfer(plan, step)
        if plan.send_to is None:
            ends = self._collective_end(
                plan, gs, noise.transfer[s, p], extra, noise.end_jitter[s, p]
            )
        else:
            ends = self._p2p_ends(plan, gs, noise.transfer[s, p], extra, noise.end_jitter[s, p])
        if hang is not None:
            self._apply_hang(plan, p, hang, api, gs, ends)
        out.api_start[s], out.enq_start[s], out.enq_end[s], out.gpu_start[s] = api, enq_s, enq_e, gs
        out.end[s] = ends[0]
        if out.recv_end is not None:
            out.recv_end[s] = ends[1]
        done = ends[0] if len(ends) == 1 else np.fmax(ends[0], ends[1])
        self.clocks.gpu_free = np.where(np.isnan(done), np.inf, done)

    def _collective_end(self, plan: PhasePlan, gs, tnoise, extra, jitter) -> tuple[np.ndarray]:
        size = self.layout.n // plan.groups
        last = gs[plan.perm].reshape(plan.groups, size).max(axis=1)
        transfer = plan.transfer_ns * tnoise[: plan.groups] + extra
        return (last[plan.group_of] + transfer[plan.group_of] + jitter,)

    def _p2p_ends(self, plan: PhasePlan, gs, tnoise, extra, jitter):
        """(send end, receive end) per rank; NaN where the rank has no such op."""
        n = self.layout.n
        send_end, recv_end = np.full(n, np.nan), np.full(n, np.nan)
        src = np.flatnonzero(plan.send_to >= 0)
        dst = plan.send_to[src]
        transfer = plan.transfer_ns * tnoise + extra
        pair_end = np.maximum(gs[src], gs[dst]) + transfer[src]
        send_end[src] = pair_end + jitter[src]
        recv_end[dst] = pair_end + jitter[dst] * 0.5
        return send_end, recv_end

    def _apply_hang(self, plan: PhasePlan, p: int, hang: HangState, api, gs, ends) -> None:
        """Ops that cannot complete: any member missing or stuck. Their ends become NaN."""
        bad = hang.blocked | ~hang.issuing
        if plan.send_to is None:
            size = self.layout.n // plan.groups
            stuck = bad[plan.perm].reshape(plan.groups, size).any(axis=1)[plan.group_of]
            parts = [("coll", stuck, ends[0])]
        else:
            src = plan.send_to
            send_stuck = (src >= 0) & (bad | bad[np.maximum(src, 0)])
            recv_stuck = np.zeros_like(send_stuck)
            recv_stuck[src[src >= 0]] = send_stuck[src >= 0]
            parts = [("send", send_stuck, ends[0]), ("recv", recv_stuck, ends[1])]
        for part, stuck, end in parts:
            for r in np.flatnonzero(stuck & hang.issuing):
                started = None if hang.blocked[r] else float(gs[r])
                hang.in_flight.append(InFlight(int(r), p, part, float(api[r]), started))
            end[stuck] = np.nan
        for r in np.flatnonzero(~hang.issuing):
            api[r] = gs[r] = np.nan
        gs[hang.blocked] = np.nan
        hang.blocked |= hang.issuing & np.logical_or.reduce([st for _, st, _ in parts])


def _empty_phase(steps: int, n: int, plan: PhasePlan) -> PhaseTimes:
    def nan() -> np.ndarray:
        return np.full((steps, n), np.nan)

    recv = nan() if plan.send_to is not None else None
    return PhaseTimes(nan(), nan(), nan(), nan(), nan(), recv)
