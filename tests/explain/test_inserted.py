"""Inserted work: ops one rank runs that its peers and its own history do not have
(no op is longer, so duration departures cannot see them)."""

from __future__ import annotations

import numpy as np
from explain_support import fault

from rankwatch.explain.inserted import unmatched


def _inserted_roots(findings: list) -> list[dict]:
    return [f.root for f in findings if f.root and f.root["metric"] == "inserted"]


def test_alignment_finds_an_inserted_run_and_ignores_moves() -> None:
    ref = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    got = np.array([1, 2, 3, 9, 9, 4, 5, 6, 7, 8])
    assert np.flatnonzero(unmatched(got, ref)).tolist() == [3, 4]
    moved = np.array([1, 3, 2, 4, 5, 6, 7, 8])  # 2 and 3 swapped: nothing inserted
    assert not unmatched(moved, ref).any()
    assert not unmatched(ref, ref).any()
    assert unmatched(np.arange(100), np.arange(100, 200), max_d=10) is None


def test_extra_matmuls_in_a_slow_step_are_the_root(analysed, traces) -> None:
    a = analysed("inserted")
    truth = fault(traces("inserted")[1], "extra_ops")
    [f] = [f for f in a.findings if f.step == truth["step"]]
    assert f.kind == "slow_step" and f.culprit == truth["rank"]
    root = f.root
    assert root["metric"] == "inserted" and root["rank"] == truth["rank"]
    assert root["step"] == truth["step"]
    assert root["name"] == truth["cpu_op"]
    mm = next(g for g in root["groups"] if g["host_ops"] == [truth["cpu_op"]])
    assert mm["count"] == truth["count"]
    assert mm["kernels"][0]["name"] == truth["kernel"]
    assert abs(root["extra_ns"] - truth["extra_ns"]) <= 0.1 * truth["extra_ns"]
    # the waits it caused are the others' waits at the next all-reduce, mostly explained
    assert sorted(f.waits_caused_ns) == ["0", "1", "3"]
    assert f.unexplained_ns < 0.1 * f.arrival_late_ns
    assert [g["gpu_ns"] > 0 for g in root["groups"]] == [True, True]


def test_persistent_extra_work_is_named_at_its_first_step(analysed, traces) -> None:
    a = analysed("inserted_persistent")
    truth = [f for f in traces("inserted_persistent")[1]["faults"] if f["kind"] == "extra_ops"]
    first = min(f["step"] for f in truth)
    roots = _inserted_roots(a.findings)
    assert len(roots) == 1
    root = roots[0]
    assert (root["rank"], root["step"]) == (1, first)
    assert root["also_in_steps"] == sorted(f["step"] for f in truth if f["step"] > first)
    want = next(f for f in truth if f["step"] == first)["extra_ns"]
    assert abs(root["extra_ns"] - want) <= 0.1 * want


def test_healthy_and_other_faults_have_no_inserted_work(analysed) -> None:
    for case in ("healthy", "faulty", "steady"):
        assert _inserted_roots(analysed(case).findings) == [], case
