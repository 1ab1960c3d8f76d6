"""The evaluation suite: simulated jobs with known faults (see detect_scenarios.py).

Each scenario must name exactly its culprits, with the right cause and onset; the
suite as a whole must meet the floors (precision, recall, culprit and cause
accuracy, detection delay, what-if cost), and prints its table (pytest -s)."""

from __future__ import annotations

import pytest
from detect_scenarios import (
    MAX_COST_ERROR,
    SUITE,
    Result,
    failures,
    row,
    summary,
    table,
)

NAMES = [sc.name for sc in SUITE]


def test_the_suite_has_at_least_30_scenarios_of_every_kind() -> None:
    assert len(SUITE) >= 30
    names = " ".join(NAMES)
    for word in (
        "healthy",
        "rotating",
        "stage_imbalance",
        "transfer",
        "host",
        "gpu",
        "hang",
        "desync",
        "noise",
    ):
        assert word in names


@pytest.mark.parametrize("name", NAMES)
def test_scenario_names_its_culprits_and_nothing_else(
    name: str, suite_results: dict[str, Result]
) -> None:
    result = suite_results[name]
    missed = [e for e, f in result.matched if f is None]
    assert not missed, (
        f"not found: {missed}; findings: {[(f.kind, f.rank, f.cause) for f in result.findings]}"
    )
    assert not result.false, (
        f"unexpected: {[(f.kind, f.rank, f.cause, f.since) for f in result.false]}"
    )


@pytest.mark.parametrize(
    "name", [sc.name for sc in SUITE if sc.faults() or sc.cfg.hang or sc.cfg.desync]
)
def test_scenario_cause_and_onset(name: str, suite_results: dict[str, Result]) -> None:
    for e, f in suite_results[name].matched:
        assert f is not None
        assert f.cause == e.cause
        assert f.since is not None and f.since.seq == e.seq, (f.since, e)
        if e.rank is None:
            assert f.comm is not None and f.comm.id == e.comm


@pytest.mark.parametrize("name", [sc.name for sc in SUITE if sc.faults() and not sc.low_snr])
def test_what_if_cost_is_the_job_time_the_stragglers_took(
    name: str, suite_results: dict[str, Result]
) -> None:
    result = suite_results[name]
    assert result.true_cost_s is not None and result.total_cost_s is not None
    assert abs(result.total_cost_s - result.true_cost_s) <= MAX_COST_ERROR * result.true_cost_s


def test_suite_meets_its_floors(suite_results: dict[str, Result]) -> None:
    rows = [row(suite_results[name]) for name in NAMES]
    print("\n" + table(rows))
    assert not failures(summary(rows)), failures(summary(rows))
