"""`rankwatch demo`'s verdict: the injected straggler against what was found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rankwatch.cli import main
from rankwatch.cli.demo import verdict
from rankwatch.collect.fake_job import Straggler
from rankwatch.collect.plugin import driver_path
from rankwatch.errors import PluginNotFoundError

INJECTED = Straggler(rank=2, from_step=40, cause="gpu", delay_us=2000)


def _straggler(rank: int | None, cause: str, seq: int = 80, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "straggler", "rank": rank, "cause": cause, "cost_s": 0.2,
        "since": {"ns": 1, "seq": seq},
        "evidence": {"onset": {"func": "AllReduce", "seq": seq},
                     "detected_at": {"func": "AllGather", "seq": 41}},
        **extra,
    }  # fmt: skip


def test_the_injected_straggler_found_with_its_steps() -> None:
    lines = verdict(INJECTED, [_straggler(2, "gpu")])
    assert lines[1] == "  injected: rank 2, gpu-slow by 2000 us per step from step 40"
    # AllReduce #80 is step 40 (two per step), AllGather #41 step 41 (one per step)
    assert lines[2] == (
        "  found:    rank 2, cause gpu, since step 40, confirmed at step 41; "
        "it cost the job 0.200 s"
    )
    assert len(lines) == 3


@pytest.mark.parametrize(
    "findings", [[], [_straggler(1, "gpu")], [{"kind": "hang", "rank": 2, "cause": "gpu"}]]
)
def test_a_wrong_rank_or_cause_is_no_match(findings: list[dict[str, Any]]) -> None:
    lines = verdict(INJECTED, findings)
    assert lines[2] == "  found:    nothing matching it (see the findings above)"
    assert sum(line.startswith("  also:") for line in lines) == len(findings)


def test_the_right_rank_with_another_cause_or_onset_says_what_differs() -> None:
    lines = verdict(INJECTED, [_straggler(2, "host", seq=16)])
    assert lines[2].startswith("  found:    rank 2, cause host, since step 8,")
    assert lines[3] == "            the cause differs: gpu was injected"
    assert lines[4].startswith("            the onset is 32 steps early:")
    assert not any(line.startswith("  also:") for line in lines)
    late = verdict(INJECTED, [_straggler(2, "gpu", seq=100)])  # AllReduce #100: step 50
    assert late[3] == "            the onset is 10 steps after the injected one"
    assert len(verdict(INJECTED, [_straggler(2, "gpu", seq=84)])) == 3  # step 42: close


def test_the_rank_found_wins_over_a_communicators_finding() -> None:
    slow_link = Straggler(rank=2, from_step=40, cause="transfer")
    found = [_straggler(None, "transfer"), _straggler(2, "transfer")]
    lines = verdict(slow_link, found)
    assert lines[2].startswith("  found:    rank 2, cause transfer")
    assert lines[3] == (
        "  also:     straggler a communicator, cause transfer, cost 0.200 s: not injected"
    )


def test_findings_nobody_injected_are_listed_as_such() -> None:
    lines = verdict(INJECTED, [_straggler(2, "gpu"), _straggler(0, "host", cost_s=0.03)])
    assert lines[3] == "  also:     straggler rank 0, cause host, cost 0.030 s: not injected"
    assert "delays nobody injected" in lines[4]


def test_a_slow_transfer_on_one_communicator_has_no_rank() -> None:
    slow_link = Straggler(rank=2, from_step=40, cause="transfer")
    lines = verdict(slow_link, [_straggler(None, "transfer", cost_s=None)])
    assert lines[2].startswith("  found:    the communicator, cause transfer, since step 40")
    assert "cannot tell whose link" in lines[3]
    assert not any(line.startswith("  also:") for line in lines)


def _have_driver() -> bool:
    try:
        driver_path()
    except PluginNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _have_driver(), reason="fake NCCL driver not built")
def test_the_demo_ends_with_its_verdict(tmp_path: Path) -> None:
    """The driver's ranks start each step together, so rank 2 is the one found, as
    injected (one more run if a loaded machine stalled a rank for long, as in
    tests/detect/test_fake_job.py)."""
    want = "  found:    rank 2, cause gpu, since step "
    for attempt in range(2):
        out = tmp_path / f"d{attempt}"
        result = CliRunner().invoke(main, ["demo", "--out", str(out), "--steps", "40"])
        assert result.exit_code == 0, result.output
        tail = result.output.split("What the demo injected, and what rankwatch found:\n")[1]
        assert tail.startswith("  injected: rank 2, gpu-slow by 2000 us per step from step 20\n")
        if tail.splitlines()[1].startswith(want):
            break
    assert tail.splitlines()[1].startswith(want), tail
