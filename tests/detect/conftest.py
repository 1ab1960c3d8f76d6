"""Fixtures of the detector tests: the evaluation suite, run once per session."""

from __future__ import annotations

import pytest
from detect_scenarios import SUITE, Result, run_scenario


@pytest.fixture(scope="session")
def suite_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every scenario of the suite simulated, ingested, aligned and detected, once."""
    root = tmp_path_factory.mktemp("detect-suite")
    return {sc.name: run_scenario(sc, root) for sc in SUITE}
