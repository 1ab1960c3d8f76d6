"""Fixtures for the analysis tests: simulated jobs, each made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_support import JOBS

from rankwatch.simulate import simulate


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory):
    """sim(name) -> directory of the simulated job `name` (see JOBS), made once."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            out = tmp_path_factory.mktemp(f"sim-{name}")
            simulate(JOBS[name], out)
            made[name] = out
        return made[name]

    return get
