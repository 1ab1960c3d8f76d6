"""`rankwatch trace` on real PyTorch Profiler traces of 2 H200 GPUs (PyTorch 2.11,
NCCL 2.28.9; tests/fixtures/h200x2/README.md): from step 20 on, rank 1 runs 12 extra
8192x8192 bf16 matmuls (aten::matmul -> aten::mm, then aten::mul_) after the loss and
before backward, outside any layer annotation. No op gets longer: the fault is
inserted work. Expected values are computed here from the raw trace events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from rankwatch.explain.analysis import TraceAnalysis, TraceOptions, analyze

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "h200x2" / "ddp-gpu-profiled"
TRACE = RUN / "trace"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
EXTRA_DIMS = [8192, 8192]


def _events(rank: int) -> list[dict[str, Any]]:
    with gzip.open(TRACE / f"rank{rank}.json.gz", "rt") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def _truth() -> dict[str, Any]:
    return json.loads((RUN / "job" / "truth-rank1.json").read_text())


def _step_window(events: list[dict[str, Any]], step: int) -> tuple[float, float]:
    marker = f"ProfilerStep#{step}"
    [e] = [e for e in events if e["cat"] == "user_annotation" and e["name"] == marker]
    return e["ts"], e["ts"] + e["dur"]


def _injected_gpu_ns(events: list[dict[str, Any]], step: int) -> tuple[int, float]:
    """(number of injected matmuls, GPU time of everything they launched in ns): the
    aten::mm / aten::mul_ calls on square 8192x8192 operands in the step, and the GPU
    ops sharing their External id."""
    lo, hi = _step_window(events, step)
    ext: set[int] = set()
    mms = 0
    for e in events:
        if e["cat"] != "cpu_op" or not lo <= e["ts"] < hi:
            continue
        dims = (e.get("args") or {}).get("Input Dims") or []
        if e["name"] == "aten::mm" and dims == [EXTRA_DIMS, EXTRA_DIMS]:
            mms += 1
            ext.add(e["args"]["External id"])
        elif e["name"] == "aten::mul_" and dims and dims[0] == EXTRA_DIMS:
            ext.add(e["args"]["External id"])
    gpu = [e for e in events if e["cat"] in GPU_CATS and e["args"].get("External id") in ext]
    return mms, sum(e["dur"] for e in gpu) * 1000.0


@pytest.fixture(scope="module")
def real() -> TraceAnalysis:
    return analyze([TRACE], TraceOptions(jobs=1, gpu="H200"))


def _first_divergence(a: TraceAnalysis) -> dict[str, Any]:
    """The earliest root named (slow steps, inserted work, steady state)."""
    roots = [f.root for f in a.findings if f.root]
    assert roots, [f.to_dict() for f in a.findings]
    return min(roots, key=lambda r: r["step"])


def test_fixture_is_what_the_tests_assume() -> None:
    truth = _truth()
    assert (truth["fault"], truth["fault_rank"], truth["fault_step"]) == ("gpu", 1, 20)
    mms, gpu_ns = _injected_gpu_ns(_events(1), 20)
    assert mms == truth["extra_matmuls"] == 12 and gpu_ns > 0
    assert _injected_gpu_ns(_events(1), 19)[0] == 0  # healthy before


def test_extra_matmuls_are_the_first_unexplained_divergence(real: TraceAnalysis) -> None:
    truth = _truth()
    root = _first_divergence(real)
    assert (root["rank"], root["step"]) == (truth["fault_rank"], truth["fault_step"])
    assert root["metric"] == "inserted"
    assert root["name"] == "aten::mm" and "aten::matmul" in root["host_op"]
    assert not root["name"].startswith("nccl") and "allreduce" not in root["name"]
    mm = next(g for g in root["groups"] if g["host_ops"][-1:] == ["aten::mm"])
    assert abs(mm["count"] - truth["extra_matmuls"]) <= 1
    assert any(g["host_ops"][-1:] == ["aten::mul_"] for g in root["groups"])
    assert root["annotation"] is None  # outside any layer
    assert root["after_annotation"] == "layer23"
    _, want = _injected_gpu_ns(_events(1), truth["fault_step"])
    assert abs(root["extra_ns"] - want) <= 0.3 * want
    assert 21 in root["also_in_steps"]


def test_the_waits_it_caused_are_on_rank_0(real: TraceAnalysis) -> None:
    [f] = [f for f in real.findings if f.root and f.root["metric"] == "inserted"]
    assert f.culprit == 1
    assert set(f.waits_caused_ns) == {"0"} and f.waits_caused_ns["0"] > 0
    assert f.root["next_collective"].startswith("allreduce")


def test_ledger_sums_to_each_measured_step(real: TraceAnalysis) -> None:
    assert real.ledger.check() == []
    for rank in (0, 1):
        events = _events(rank)
        for row in real.ledger.for_rank(rank):
            lo, hi = _step_window(events, row.step)
            assert row.wall_ns == pytest.approx((hi - lo) * 1000, abs=2)
            assert sum(row.buckets.values()) == row.wall_ns
    assert len(real.ledger.rows) == 8


def test_healthy_steps_alone_claim_nothing() -> None:
    # only steps 18 and 19 are steps: the rest of the trace lies outside every window
    opts = TraceOptions(jobs=1, step_pattern=r"^ProfilerStep\s*#\s*(1[89])\b")
    a = analyze([TRACE], opts)
    assert a.steps.common == [18, 19]
    assert a.findings == []
    assert a.ledger.check() == []
