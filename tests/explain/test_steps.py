"""Step alignment across ranks: by number, re-aligned through Seq, or one window."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from rankwatch.explain.analysis import TraceOptions, analyze
from rankwatch.explain.load import find_trace_files


def _copy(src: Path, dst: Path) -> list[Path]:
    dst.mkdir()
    return [Path(shutil.copy(f, dst)) for f in find_trace_files([src])]


def _rewrite(path: Path, pattern: str, repl) -> None:
    path.write_text(re.sub(pattern, repl, path.read_text()))


def test_ranks_with_different_step_numbers_are_realigned_through_seq(traces, tmp_path) -> None:
    files = _copy(traces("v2_11")[0], tmp_path / "job")
    _rewrite(files[1], r"ProfilerStep#(\d+)", lambda m: f"ProfilerStep#{int(m.group(1)) + 100}")
    a = analyze([tmp_path / "job"], TraceOptions(jobs=1))
    assert a.steps.shift == {1: -100}
    assert any("re-aligned through collective Seq" in n for n in a.steps.notes)
    assert a.steps.common == list(range(5, 13))
    assert [f.step for f in a.findings if f.kind == "slow_step"] == [9]


def test_a_step_missing_on_one_rank_is_reported(traces, tmp_path) -> None:
    files = _copy(traces("v2_11")[0], tmp_path / "job")
    _rewrite(files[0], r"ProfilerStep#7\b", "SomethingElse")
    a = analyze([tmp_path / "job"], TraceOptions(jobs=1))
    assert a.steps.missing == {7: [0]}
    assert 7 not in a.steps.common and a.ledger.check() == []


def test_no_step_markers_analyse_each_trace_as_one_window(traces, tmp_path) -> None:
    files = _copy(traces("v2_11")[0], tmp_path / "job")
    for f in files:
        _rewrite(f, r"ProfilerStep#(\d+)", r"Iteration annotation \1")
    a = analyze([tmp_path / "job"], TraceOptions(jobs=1))
    assert a.steps.source == "whole trace (no step markers)"
    assert len(a.ledger.rows) == 2 and a.ledger.check() == []


def test_custom_step_pattern(traces, tmp_path) -> None:
    files = _copy(traces("v2_11")[0], tmp_path / "job")
    for f in files:
        _rewrite(f, r"ProfilerStep#(\d+)", r"train/iter=\1")
    a = analyze([tmp_path / "job"], TraceOptions(jobs=1, step_pattern=r"^train/iter=(\d+)$"))
    assert a.steps.common == list(range(5, 13))
