"""Fixtures for the trace-analysis tests: synthetic per-rank traces with known faults
(rankwatch.explain.synth), each generated and analysed once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from explain_support import CASES

from rankwatch.explain.analysis import TraceAnalysis, TraceOptions, analyze
from rankwatch.explain.synth_files import generate


@pytest.fixture(scope="session")
def traces(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[Path, dict[str, Any]]]:
    """traces(name) -> (directory, ground truth) of case `name` (see CASES)."""
    made: dict[str, tuple[Path, dict[str, Any]]] = {}

    def get(name: str) -> tuple[Path, dict[str, Any]]:
        if name not in made:
            cfg, variant = CASES[name]
            out = tmp_path_factory.mktemp(f"trace-{name}")
            made[name] = (out, generate(cfg, out, variant))
        return made[name]

    return get


@pytest.fixture(scope="session")
def analysed(traces: Callable[[str], tuple[Path, Any]]) -> Callable[[str], TraceAnalysis]:
    """analysed(name) -> TraceAnalysis of case `name`, read in this process."""
    done: dict[str, TraceAnalysis] = {}

    def get(name: str) -> TraceAnalysis:
        if name not in done:
            path, _ = traces(name)
            done[name] = analyze([path], TraceOptions(jobs=1))
        return done[name]

    return get
