"""Ground truth of a simulated job, written as truth.json next to its records."""

from __future__ import annotations

import dataclasses
from typing import Any

from rankwatch.simulate.records import DesyncPlan, rank_slots
from rankwatch.simulate.writer import Job, WorkerSummary

TRUTH_FILE = "truth.json"


def _hosts(job: Job) -> list[dict[str, Any]]:
    clocks = job.clocks
    ref = float(clocks.host_offset_ns[0])
    return [
        {
            "host": name,
            "offset_ns": round(float(clocks.host_offset_ns[h])),
            "drift_ppm": float(clocks.host_drift_ppm[h]),
            "offset_vs_reference_ns": round(float(clocks.host_offset_ns[h]) - ref),
        }
        for h, name in enumerate(job.layout.hostnames)
    ]


def _ranks(job: Job, summaries: list[WorkerSummary]) -> list[dict[str, Any]]:
    ops = {r: n for s in summaries for r, n in s.ops.items()}
    out = []
    for r in range(job.cfg.ranks):
        stem = job.file_stem(r)
        out.append(
            {
                "rank": r,
                "host": job.layout.hostnames[int(job.layout.host_of[r])],
                "pid": int(job.layout.pids[r]),
                "op_file": f"{stem}.log",
                "state_file": f"{stem}.rwstate.jsonl",
                "op_records": ops.get(r, 0),
            }
        )
    return out


def _communicators(job: Job) -> list[dict[str, Any]]:
    return [
        {"id": c.id_str, "name": c.name, "kind": c.kind, "ranks": list(c.ranks), "nnodes": c.nnodes}
        for kind in job.layout.comms
        for c in job.layout.comms[kind]
    ]


def _first_op(job: Job, rank: int, step: int) -> dict[str, Any]:
    """The first op `rank` issues in `step`: what a fault at that step hits first."""
    slot = rank_slots(job.layout, job.phases, rank)[0]
    phase = job.phases[slot.phase_index]
    comm = job.layout.comm_of(phase.comm, rank)
    return {
        "comm_id": comm.id_str,
        "comm_name": comm.name,
        "func": slot.func,
        "seq": step * slot.seq_per_step + slot.seq_in_step,
        "phase": phase.name,
        "seqs_per_step": slot.seq_per_step,
    }


_EFFECTS = {
    "host": "arrival_ns (API call) late",
    "gpu": "gpu_start_ns late, API on time",
    "transfer": "transfer time longer for ops involving the rank",
}


def _slow_truth(job: Job) -> dict[str, Any]:
    f = job.cfg.slow
    assert f is not None
    host = job.layout.hostnames[int(job.layout.host_of[f.rank])]
    return {
        "kind": "slow", "rank": f.rank, "host": host,
        "from_step": f.from_step, "cause": f.cause, "slow_us": f.us, "effect": _EFFECTS[f.cause],
        "first_affected_op": _first_op(job, f.rank, f.from_step),
    }  # fmt: skip


def _desync_truth(job: Job, plan: DesyncPlan) -> dict[str, Any]:
    comm = job.layout.comm_of(plan.comm, plan.rank)
    phase = job.phases[plan.phase_index]
    same = [p.comm == plan.comm and p.func == phase.func for p in job.phases]
    issued = (
        "AllGather"
        if plan.kind == "func"
        else f"{phase.func} with count {phase.count // 2} instead of {phase.count}"
    )
    return {
        "kind": "desync", "rank": plan.rank, "at_step": plan.step, "desync_kind": plan.kind,
        "comm_id": comm.id_str, "comm_name": comm.name, "func": phase.func,
        "seq": plan.step * sum(same) + sum(same[: plan.phase_index]), "rank_issued": issued,
    }  # fmt: skip


def _faults(job: Job, summaries: list[WorkerSummary]) -> list[dict[str, Any]]:
    faults = []
    if job.cfg.slow is not None:
        faults.append(_slow_truth(job))
    if job.cfg.hang is not None:
        faults.append(_hang_truth(job, summaries))
    plan = DesyncPlan.of(job.layout, job.phases)
    if plan is not None:
        faults.append(_desync_truth(job, plan))
    return faults


def _hang_truth(job: Job, summaries: list[WorkerSummary]) -> dict[str, Any]:
    hang = job.cfg.hang
    assert hang is not None
    stuck = []
    in_flight = summaries[0].in_flight if summaries else []
    for op in in_flight:
        if op.gpu_start is None:
            continue  # queued behind the stuck kernel: a symptom, not where it is stuck
        phase = job.phases[op.phase]
        comm = job.layout.comm_of(phase.comm, op.rank)
        stuck.append(
            {
                "rank": op.rank,
                "comm_id": comm.id_str,
                "comm_name": comm.name,
                "func": "Recv"
                if op.part == "recv"
                else "Send"
                if op.part == "send"
                else phase.func,
                "phase": phase.name,
            }
        )
    return {
        "kind": "hang",
        "rank": hang.rank,
        "host": job.layout.hostnames[int(job.layout.host_of[hang.rank])],
        "at_step": hang.at_step,
        "first_missing_op": _first_op(job, hang.rank, hang.at_step),
        "peers_stuck_in_kernel": stuck,
    }


def build_truth(job: Job, summaries: list[WorkerSummary]) -> dict[str, Any]:
    cfg = job.cfg
    ops = sum(n for s in summaries for n in s.ops.values())
    p2p = sum(n for s in summaries for n in s.p2p.values())
    state: dict[str, int] = {}
    for s in summaries:
        for k, v in s.state.items():
            state[k] = state.get(k, 0) + v
    config = dataclasses.asdict(cfg)
    config.pop("_dp", None)
    return {
        "format": "rankwatch-simulation-truth",
        "version": 1,
        "config": config,
        "job": {
            "job_id": cfg.job_id,
            "ranks": cfg.ranks,
            "hosts": cfg.hosts,
            "tp": cfg.tp,
            "pp": cfg.pp,
            "dp": cfg.dp_size,
            "steps_run": summaries[0].steps_run,
            "start_ns": cfg.start_ns,
            "ops_per_step": [p.name for p in job.phases],
        },
        "reference_host": job.layout.hostnames[0],
        "clock_model": "host_clock = true_time + offset_ns + drift_ppm * 1e-6 * (true_time - "
        "start_ns); offsets and drifts are at start_ns",
        "hosts": _hosts(job),
        "ranks": _ranks(job, summaries),
        "communicators": _communicators(job),
        "records": {
            "ops": ops,
            "coll": ops - p2p,
            "p2p": p2p,
            "state": state,
            "files": 2 * cfg.ranks,
        },
        "faults": _faults(job, summaries),
    }
