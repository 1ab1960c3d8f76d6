"""First unexplained divergence: the right rank, op, step and extra time; not the
downstream collective; nothing claimed on healthy jobs."""

from __future__ import annotations

import pytest
from explain_support import KINETO_VARIANTS, NSYS_VARIANTS, fault, slow_step_finding

from rankwatch.explain.synth import FWD_OPS, GEMM_FWD


def _within(got: int, want: int, share: float = 0.10) -> bool:
    return abs(got - want) <= share * want


def test_slow_gemm_is_the_root_not_the_all_reduce(analysed, traces) -> None:
    a = analysed("faulty")
    truth = fault(traces("faulty")[1], "slow_kernel")
    f = slow_step_finding(a.findings, 12)
    assert f.culprit == 3
    assert f.collective.startswith("allreduce")
    root = f.root
    assert root["rank"] == 3 and root["step"] == 12
    assert root["kind"] == "kernel" and root["metric"] == "dur"
    assert root["name"] == truth["kernel"] and not root["name"].startswith("nccl")
    assert root["host_op"] == truth["cpu_op"]
    assert root["annotation"] == truth["annotation"] == "layers.7"
    assert _within(root["extra_ns"], truth["extra_ns"])
    # the waits it caused on every other rank are reported, and nearly all explained
    assert sorted(f.waits_caused_ns) == ["0", "1", "2"]
    assert all(_within(w, truth["extra_ns"], 0.15) for w in f.waits_caused_ns.values())
    assert f.unexplained_ns < 0.1 * f.arrival_late_ns


def test_dataloader_wait_is_the_root_of_its_slow_step(analysed, traces) -> None:
    a = analysed("faulty")
    truth = fault(traces("faulty")[1], "input_wait")
    f = slow_step_finding(a.findings, 8)
    assert f.culprit == 1
    assert f.root["kind"] == "input_wait" and f.root["rank"] == 1
    assert f.root["name"] == truth["name"]
    assert _within(f.root["extra_ns"], truth["extra_ns"])


def test_only_the_faulty_steps_are_slow_and_no_steady_straggler(analysed) -> None:
    a = analysed("faulty")
    assert a.step_stats["slow_steps"] == [8, 12]
    assert [f.kind for f in a.findings] == ["slow_step", "slow_step"]


def test_healthy_job_gets_no_finding(analysed) -> None:
    a = analysed("healthy")
    assert a.findings == []
    assert a.step_stats["slow_steps"] == []


def test_fsdp_slow_kernel_is_found_through_all_gather_dependencies(analysed, traces) -> None:
    a = analysed("fsdp")
    truth = fault(traces("fsdp")[1], "slow_kernel")
    f = slow_step_finding(a.findings, truth["step"])
    assert f.root["rank"] == truth["rank"] == 2
    assert f.root["name"] == truth["kernel"]
    assert f.root["annotation"] == truth["annotation"]
    assert _within(f.root["extra_ns"], truth["extra_ns"])


@pytest.mark.parametrize("variant", [*KINETO_VARIANTS, *NSYS_VARIANTS, "cpu"])
def test_root_is_found_in_every_trace_variant(analysed, traces, variant: str) -> None:
    a = analysed(variant)
    truth = fault(traces(variant)[1], "slow_kernel")
    f = slow_step_finding(a.findings, truth["step"])
    assert f.root["rank"] == truth["rank"]
    want = truth["cpu_op"] if variant == "cpu" else truth["kernel"]
    assert f.root["name"] == want
    assert _within(f.root["extra_ns"], truth["extra_ns"], 0.10)


def test_persistent_straggler_is_a_steady_state_finding(analysed) -> None:
    a = analysed("steady")
    [f] = [f for f in a.findings if f.kind == "steady_state"]
    assert f.culprit == 2
    assert f.root["rank"] == 2 and f.root["name"] == GEMM_FWD
    mlp_up_ms = next(op[3] for op in FWD_OPS if op[0] == "mlp_up")
    assert _within(f.root["extra_ns"], round(0.4 * mlp_up_ms * 1e6), 0.25)
