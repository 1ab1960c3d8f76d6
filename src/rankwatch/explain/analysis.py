"""`analyze(paths, opts)`: the whole trace analysis, reader to findings.

load (one process per file) -> steps aligned by number -> collectives matched,
checked and split into transfer / wait -> clock offsets (for trust in cross-rank
order only) -> ledger per rank and step -> op table -> first unexplained
divergence -> efficiency. Every stage takes what the previous ones produced; the
result (TraceAnalysis) is rendered by report / html.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.errors import RecordError
from rankwatch.explain import collectives, divergence, efficiency, ledger, optable
from rankwatch.explain.clock import ClockResult, estimate
from rankwatch.explain.events import DEFAULT_INPUT_PATTERN, DEFAULT_STEP_PATTERN, RankTrace
from rankwatch.explain.links import Links
from rankwatch.explain.load import Loaded, ReadOptions, load
from rankwatch.explain.steps import StepTable, align_steps
from rankwatch.model import Problem


@dataclass
class TraceOptions:
    jobs: int = 0
    step_pattern: str = DEFAULT_STEP_PATTERN
    input_pattern: str = DEFAULT_INPUT_PATTERN
    model_flops: str | None = None
    hardware_flops: float | None = None
    peak_flops: float | None = None
    gpu: str | None = None
    dtype: str = "bf16"
    world_size: int | None = None
    busbw_peak_gbs: float | None = None
    busbw_baseline: str | None = None


@dataclass
class TraceAnalysis:
    loaded: Loaded
    traces: list[RankTrace]
    steps: StepTable
    table: collectives.CollectiveTable
    clock: ClockResult
    ledger: ledger.Ledger
    ops: optable.OpTable
    findings: list[divergence.Finding]
    step_stats: dict[str, Any]
    efficiency: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@contextmanager
def _timed(
    timings: dict[str, float], name: str, progress: Callable[[str], None] | None
) -> Iterator[None]:
    if progress:
        progress(name)
    t0 = time.perf_counter()
    yield
    timings[name] = round(time.perf_counter() - t0, 3)


def _no_traces(paths: list[Any], loaded: Loaded) -> RecordError:
    found = f"{len(loaded.files)} file(s)" if loaded.files else "no trace files"
    details = "; ".join(str(p) for p in loaded.problems[:3])
    return RecordError(
        f"nothing usable to analyse: {found}" + (f" ({details})" if details else ""),
        file=", ".join(os.fspath(p) for p in paths),
    )


def analyze(
    paths: list[str | os.PathLike[str]],
    opts: TraceOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> TraceAnalysis:
    """Analyse the per-rank traces under `paths` (see module doc)."""
    opts = opts or TraceOptions()
    timings: dict[str, float] = {}
    with _timed(timings, "reading traces", progress):
        loaded = load(paths, ReadOptions(opts.step_pattern, opts.input_pattern), opts.jobs)
    if not loaded.traces:
        raise _no_traces(paths, loaded)
    traces = loaded.traces
    with _timed(timings, "aligning steps and collectives", progress):
        links = {t.rank: Links.build(t) for t in traces}
        steps = align_steps(traces)
        table = collectives.match(traces, links, steps)
    with _timed(timings, "estimating clock offsets", progress):
        clock = _clock(traces, table, loaded)
    with _timed(timings, "building the ledger", progress):
        led = ledger.build(traces, links, steps, table)
    with _timed(timings, "searching for the first divergence", progress):
        ops = optable.build(traces, links, steps)
        findings, stats = divergence.find(steps, table, led, ops, links)
    a = TraceAnalysis(loaded, traces, steps, table, clock, led, ops, findings, stats)
    a.efficiency = efficiency_report(a, opts)
    a.timings = timings
    return a


def _clock(
    traces: list[RankTrace], table: collectives.CollectiveTable, loaded: Loaded
) -> ClockResult:
    """Clock offsets; they only qualify cross-rank order, so a failure to estimate them
    is reported, not allowed to stop the ledger and the divergence search."""
    try:
        return estimate(traces, table)
    except Exception as exc:  # noqa: BLE001 - see docstring
        note = f"clock offsets could not be estimated ({type(exc).__name__}: {exc})"
        loaded.problems.append(Problem("clock", None, "internal", note))
        return ClockResult(None, notes=[note])


def _world(a: TraceAnalysis, opts: TraceOptions) -> tuple[int, str]:
    if opts.world_size:
        return opts.world_size, "--world-size"
    sizes = [t.world_size for t in a.traces if t.world_size]
    if sizes:
        return max(sizes), "world size in the traces"
    return len(a.traces), "number of traced ranks"


def _counted_flops(a: TraceAnalysis, world: int) -> float | None:
    """Hardware FLOPs per step from the profiler's per-op counts, scaled to all GPUs."""
    per_rank = []
    for t in a.traces:
        rs = a.steps.ranks[t.rank]
        if not len(rs.numbers) or not t.flops.any():
            continue
        inside = rs.step_at(t.start) >= 0
        per_rank.append(float(t.flops[inside].sum()) / len(rs.numbers))
    return float(np.mean(per_rank)) * world if per_rank else None


def efficiency_report(a: TraceAnalysis, opts: TraceOptions) -> dict[str, Any]:
    """MFU, HFU and bus bandwidth efficiency (see efficiency), as plain data."""
    out: dict[str, Any] = {"notes": []}
    world, world_text = _world(a, opts)
    gpu_name = next((t.gpu_name for t in a.traces if t.gpu_name), None)
    peak, peak_text = efficiency.peak_rate(opts.peak_flops, opts.gpu, gpu_name, opts.dtype)
    step_s = a.step_stats.get("median_ns", 0) / 1e9
    out.update(
        {
            "gpus": world,
            "gpus_from": world_text,
            "gpu": gpu_name,
            "peak_flops": peak,
            "peak": peak_text,
            "step_time_s": step_s,
            "dtype": opts.dtype,
        }
    )
    hw = (
        (opts.hardware_flops, "given (--hardware-flops)")
        if opts.hardware_flops
        else (
            _counted_flops(a, world),
            "counted by the profiler (with_flops) on traced ranks, x GPUs",
        )
    )
    if opts.model_flops:
        flops, text = efficiency.parse_model_flops(opts.model_flops)
        out["model_flops"] = {"value": flops, "from": text}
        if peak and step_s:
            out["mfu"] = efficiency.utilisation(
                "MFU", flops, "model", step_s, world, peak, peak_text
            ).to_dict()
    else:
        out["notes"].append("MFU needs --model-flops (a number, or params=...,tokens=...)")
    if hw[0] and peak and step_s:
        out["hfu"] = efficiency.utilisation(
            "HFU", hw[0], "hardware", step_s, world, peak, peak_text
        ).to_dict()
        out["hardware_flops"] = {"value": hw[0], "from": hw[1]}
    if not peak:
        out["notes"].append(peak_text)
    baseline = efficiency.load_baseline(opts.busbw_baseline) if opts.busbw_baseline else None
    out["busbw"] = efficiency.bus_bandwidth(a.table, opts.busbw_peak_gbs, baseline)
    return out
