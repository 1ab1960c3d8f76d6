"""The step ledger: buckets partition every rank's step exactly, with the right meaning."""

from __future__ import annotations

import numpy as np
import pytest
from explain_support import KINETO_VARIANTS, NSYS_VARIANTS

from rankwatch.explain.ledger import BUCKETS, EMPTY, Labelled, Merged, Timeline, step_row


@pytest.mark.parametrize(
    "name", ["faulty", "healthy", "fsdp", "cpu", *KINETO_VARIANTS, *NSYS_VARIANTS]
)
def test_buckets_add_up_to_the_step_wall_time_to_the_nanosecond(analysed, name: str) -> None:
    a = analysed(name)
    assert a.ledger.rows
    for row in a.ledger.rows:
        assert set(row.buckets) == set(BUCKETS)
        assert all(v >= 0 for v in row.buckets.values())
        assert sum(row.buckets.values()) == row.wall_ns, (row.rank, row.step)
        assert sum(row.wait_by_peer.values()) == row.buckets["exposed_wait"]
    assert a.ledger.check() == []
    steps = {(r.rank, r.step) for r in a.ledger.rows}
    assert len(steps) == len(a.ledger.rows)


def _m(*pairs: tuple[int, int]) -> Merged:
    return Merged.of(
        np.array([p[0] for p in pairs], dtype=np.int64),
        np.array([p[1] for p in pairs], dtype=np.int64),
    )


def test_hand_built_timeline_gets_each_bucket_right() -> None:
    """Compute 0-100, 200-220, 230-240; a comm op 60-120 waits for rank 2 until 80 then
    transfers; memcpy 130-140 (launch unknown); input 150-170; the kernel at 200 was
    launched by a call ending at 190, the one at 230 by one ending at 210."""
    tl = Timeline(
        gpu=True,
        compute=_m((0, 100), (200, 220), (230, 240)),
        memcpy=_m((130, 140)),
        transfer=_m((80, 120)),
        wait=_m((60, 80)),
        wait_peers=Labelled.of(np.array([60]), np.array([80]), np.array([2])),
        unsplit=Merged(EMPTY, EMPTY),
        inputs=_m((150, 170)),
        next_start=np.array([0, 60, 130, 200, 230], dtype=np.int64),
        next_launch_end=np.array([-1, -1, -1, 190, 210], dtype=np.int64),
    )
    row = step_row(tl, rank=0, step=1, lo=0, hi=260)
    assert row.buckets == {
        "compute": 60 + 20 + 20 + 10,  # 0-60, 60-80 (wait under compute), 200-220, 230-240
        "overlapped_comm": 20,  # 80-100: transfer under compute
        "exposed_transfer": 20,  # 100-120
        "exposed_wait": 0,  # the only wait ran under compute
        "exposed_comm_unsplit": 0,
        "memcpy": 10,
        "input_wait": 20,
        "host_launch_gap": 10 + 20,  # 140-150 and 170-190: the kernel at 200 not launched
        "idle": 10 + 10,  # 190-200 and 220-230: the next kernel was already launched
        "unclassified": 10 + 20,  # 120-130: launch unknown; 240-260: nothing follows
    }
    assert row.visual_overlap_ns == 20
    assert row.comm_ns == 60


def test_exposed_wait_is_attributed_to_the_peer_waited_for() -> None:
    tl = Timeline(
        gpu=True,
        compute=Merged(EMPTY, EMPTY),
        memcpy=Merged(EMPTY, EMPTY),
        transfer=_m((50, 60), (90, 100)),
        wait=_m((0, 50), (70, 90)),
        wait_peers=Labelled.of(np.array([0, 70]), np.array([50, 90]), np.array([3, 1])),
        unsplit=Merged(EMPTY, EMPTY),
        inputs=Merged(EMPTY, EMPTY),
        next_start=np.array([0, 70], dtype=np.int64),
        next_launch_end=np.array([-1, -1]),
    )
    row = step_row(tl, 0, 1, 0, 100)
    assert row.wait_by_peer == {3: 50, 1: 20}
    assert row.buckets["exposed_transfer"] == 20
    assert row.buckets["unclassified"] == 10  # 60-70: next op has no launch record


def test_slow_rank_appears_as_wait_on_that_peer_in_everyone_elses_ledger(analysed) -> None:
    a = analysed("faulty")
    rows = {(r.rank, r.step): r for r in a.ledger.rows}
    for victim in (0, 1, 2):
        waited = rows[(victim, 12)].wait_by_peer.get(3, 0)
        assert 0.8 * 40e6 < waited < 1.05 * 40e6, (victim, waited)
    for victim in (0, 2, 3):
        waited = rows[(victim, 8)].wait_by_peer.get(1, 0)
        assert 0.8 * 30e6 < waited < 1.05 * 30e6, (victim, waited)
    assert rows[(3, 12)].buckets["exposed_wait"] < 1e6
    assert rows[(3, 12)].buckets["compute"] - rows[(3, 13)].buckets["compute"] > 35e6
    assert rows[(1, 8)].buckets["input_wait"] > 30e6


def test_waiting_under_compute_is_visual_not_useful_overlap(analysed) -> None:
    a = analysed("faulty")
    row = next(r for r in a.ledger.rows if (r.rank, r.step) == (0, 12))
    healthy = next(r for r in a.ledger.rows if (r.rank, r.step) == (0, 13))
    assert row.visual_overlap_ns > 20e6  # backward ran while the all-reduce waited
    assert healthy.visual_overlap_ns < 2e6
    # useful overlap is transfer under compute, and not larger in the slow step
    assert row.buckets["overlapped_comm"] <= healthy.buckets["overlapped_comm"] + 1e6


def test_cpu_only_ledger_uses_the_host_timeline(analysed) -> None:
    a = analysed("cpu")
    assert not any(a.ledger.gpu.values())
    total = {b: sum(r.buckets[b] for r in a.ledger.rows) for b in BUCKETS}
    assert total["compute"] > 0 and total["exposed_transfer"] > 0 and total["input_wait"] > 0
    assert total["host_launch_gap"] == 0 and total["overlapped_comm"] == 0
