"""The synthetic jobs the trace-analysis tests use, and small helpers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from rankwatch.explain.synth import (
    ExtraMatmuls,
    InputDelay,
    SizeMismatch,
    Slowdown,
    SlowKernel,
    SynthConfig,
)

SMALL = {"ranks": 2, "steps": 8, "layers": 2, "buckets": 2}
SMALL_FAULT = SlowKernel(rank=1, step=9, layer=1, extra_ms=20.0)
KINETO_VARIANTS = ("v2_11", "v2_4", "v2_1", "v1_13")
NSYS_VARIANTS = ("nsys", "nsys_old")

CASES: dict[str, tuple[SynthConfig, str]] = {
    # the issue's scenario: rank 3's GEMM in layer 7 of step 12 is 40 ms longer, a
    # DataLoader wait on rank 1, and different clocks on every rank
    "faulty": (
        SynthConfig(
            ranks=4,
            steps=16,
            layers=8,
            clock_offsets_us=(0.0, 1500.0, -2300.0, 800.0),
            faults=(SlowKernel(3, 12, 7, 40.0), InputDelay(1, 8, 30.0)),
        ),
        "v2_11",
    ),
    "healthy": (SynthConfig(ranks=4, steps=12, layers=4, seed=3), "v2_11"),
    "fsdp": (
        SynthConfig(
            ranks=4,
            steps=10,
            layers=4,
            mode="fsdp",
            seed=5,
            faults=(SlowKernel(2, 10, 1, 15.0, op="qkv"),),
        ),
        "v2_11",
    ),
    "steady": (
        SynthConfig(ranks=4, steps=10, layers=4, seed=7, faults=(Slowdown("mlp_up", 1.4, (2,)),)),
        "v2_11",
    ),
    "mismatch": (
        SynthConfig(ranks=4, steps=8, layers=4, seed=2, faults=(SizeMismatch(2, 7, 1),)),
        "v2_4",
    ),
    "before": (SynthConfig(ranks=4, steps=10, layers=4, seed=11), "v2_11"),
    "after": (
        SynthConfig(ranks=4, steps=10, layers=4, seed=11, faults=(Slowdown("attn", 1.5),)),
        "v2_11",
    ),
    "after_rank": (
        SynthConfig(ranks=4, steps=10, layers=4, seed=11, faults=(Slowdown("ln2", 8.0, (1,)),)),
        "v2_11",
    ),
    # rank 2 runs 6 extra matmuls of 2 ms in step 11 only (a slow step) ...
    "inserted": (
        SynthConfig(ranks=4, steps=12, layers=4, seed=9, faults=(ExtraMatmuls(2, 11, 6, 2.0, 11),)),
        "v2_11",
    ),
    # ... and rank 1 from step 9 to the end (the trace's steady state changes)
    "inserted_persistent": (
        SynthConfig(ranks=2, steps=6, layers=4, seed=10, faults=(ExtraMatmuls(1, 8, 6, 2.0),)),
        "v2_11",
    ),
    "cpu": (SynthConfig(mode="cpu", seed=4, faults=(SMALL_FAULT,), **SMALL), "cpu"),
    **{
        v: (SynthConfig(seed=1, faults=(SMALL_FAULT,), clock_offsets_us=(0.0, 700.0), **SMALL), v)
        for v in KINETO_VARIANTS + NSYS_VARIANTS
    },
}


def rankwatch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `python -m rankwatch ARGS` as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "rankwatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def fault(truth: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(f for f in truth["faults"] if f["kind"] == kind)


def slow_step_finding(findings: list[Any], step: int) -> Any:
    return next(f for f in findings if f.kind == "slow_step" and f.step == step)
