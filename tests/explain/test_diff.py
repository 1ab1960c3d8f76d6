"""Regression diff: the step-time change attributed to buckets, ranks and the first
divergent op, with the remainder stated."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.explain.diff import compare, render_diff
from rankwatch.explain.ledger import BUCKETS
from rankwatch.explain.synth import FWD_OPS


def _mean_step(truth: dict) -> float:
    return float(np.mean([v for step in truth["steps"].values() for v in step.values()]))


def test_buckets_add_up_to_the_change_and_compute_carries_it(analysed, traces) -> None:
    d = compare(analysed("before"), analysed("after"))
    change = d["rank_step_wall"]["delta_ns"]
    want = _mean_step(traces("after")[1]) - _mean_step(traces("before")[1])
    assert change == pytest.approx(want, rel=1e-9)
    assert sum(d["buckets"][b]["delta_ns"] for b in BUCKETS) == pytest.approx(change, abs=1.0)
    assert d["buckets"]["compute"]["delta_ns"] > 0.9 * change
    assert abs(d["unexplained_ns"]) < 0.01 * change


def test_first_divergent_op_is_the_slowed_kernel_on_every_rank(analysed) -> None:
    d = compare(analysed("before"), analysed("after"))
    first = d["first_divergent_op"]
    assert first["name"] == "flash_fwd_kernel" and first["occurrence"] == 0
    assert first["metric"] == "dur" and first["ranks"] == [0, 1, 2, 3]
    attn_ms = next(op[3] for op in FWD_OPS if op[0] == "attn")
    assert first["shift_ns"] == pytest.approx(0.5 * attn_ms * 1e6, rel=0.1)
    top = d["by_op"][0]
    assert "flash" in top["op"] and top["delta_ns"] > 0


def test_rank_specific_regression_names_the_rank_and_the_waits(analysed) -> None:
    d = compare(analysed("before"), analysed("after_rank"))
    first = d["first_divergent_op"]
    assert first["ranks"] == [1]
    by_rank = {r["rank"]: r["delta"] for r in d["by_rank"]}
    # rank 1 computes longer; the others wait for it
    assert by_rank[1]["compute"] > 0.5 * by_rank[1]["wall"]
    assert all(by_rank[r]["exposed_wait"] > 0.5 * by_rank[r]["wall"] for r in (0, 2, 3))


def test_no_change_no_divergent_op(analysed) -> None:
    d = compare(analysed("before"), analysed("before"))
    assert d["first_divergent_op"] is None
    assert d["rank_step_wall"]["delta_ns"] == 0
    assert "none beyond run-to-run noise" in render_diff(d)


def test_text_states_the_change_and_the_remainder(analysed) -> None:
    text = render_diff(compare(analysed("before"), analysed("after")))
    assert text.startswith("Step time: ")
    assert "unexplained (unclassified)" in text
    assert "First divergent op: duration of flash_fwd_kernel" in text
