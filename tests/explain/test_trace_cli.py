"""`rankwatch trace` and `rankwatch trace diff`, run as a user runs them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from explain_support import rankwatch


def test_trace_is_a_listed_subcommand() -> None:
    result = rankwatch("--help")
    assert re.search(r"^\s+trace\s", result.stdout, flags=re.MULTILINE)
    help_text = rankwatch("trace", "--help").stdout
    assert "rankwatch trace [OPTIONS] DIR_OR_FILES..." in help_text
    assert "rankwatch trace diff [OPTIONS] BEFORE AFTER" in help_text
    assert "--model-flops" in help_text


def test_text_summary_names_the_root_and_reconciles(traces) -> None:
    path, _ = traces("faulty")
    result = rankwatch(
        "trace",
        str(path),
        "-q",
        "--model-flops",
        "params=1e9,tokens=65536",
        "--busbw-peak",
        "100",
        "--jobs",
        "2",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Input: 4 rank(s) from 4 file(s) (kineto)." in out
    assert "Slow steps: 8 (" in out and ", 12 (" in out
    assert "the buckets add up exactly to the measured step time" in out
    assert "rank 3 arrived last at allreduce" in out
    assert re.search(
        r"first divergence: kernel sm90_xmma_gemm\S* \(aten::addmm, in layers\.7\) "
        r"on rank 3, step 12: 4\d\.\d\d ms vs",
        out,
    )
    assert re.search(
        r"MFU = 3\.932e\+14 model FLOPs per step / \(0\.15\d\d s step x 4 GPUs x "
        r"9\.894e\+14 FLOP/s",
        out,
    )
    assert "bus bandwidth, allreduce" in out
    assert result.stderr == ""


def test_json_output_is_one_object_with_every_section(traces) -> None:
    path, _ = traces("faulty")
    result = rankwatch("trace", str(path), "--json", "--jobs", "1")
    assert result.returncode == 0, result.stderr
    s = json.loads(result.stdout)
    assert set(s) >= {"input", "steps", "collectives", "clock", "ledger", "findings", "efficiency"}
    assert s["ledger"]["reconciled"] is True
    for row in s["ledger"]["rows"]:
        buckets = sum(row[f"{b}_ns"] for b in s["ledger"]["buckets"])
        assert buckets == row["wall_ns"]
    assert {f["step"] for f in s["findings"]} == {8, 12}


def test_html_report_is_self_contained(traces, tmp_path: Path) -> None:
    path, _ = traces("faulty")
    out = tmp_path / "report" / "trace.html"
    result = rankwatch("trace", str(path), "-q", "--html", str(out), "--jobs", "1")
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert '<meta name="rankwatch-figures" content="3">' in page
    assert "Plotly.newPlot" in page
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"http", page)
    assert "layers.7" in page


def test_diff_attributes_a_regression(traces, tmp_path: Path) -> None:
    before, _ = traces("before")
    after, _ = traces("after")
    html = tmp_path / "diff.html"
    result = rankwatch("trace", "diff", str(before), str(after), "-q", "--html", str(html))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Step time: ")
    assert "First divergent op: duration of flash_fwd_kernel" in result.stdout
    assert html.read_text(encoding="utf-8").count("Plotly.newPlot") == 1
    js = json.loads(rankwatch("trace", "diff", str(before), str(after), "--json").stdout)
    assert js["first_divergent_op"]["name"] == "flash_fwd_kernel"


def test_bad_options_and_inputs_exit_non_zero_with_one_line(tmp_path: Path) -> None:
    missing = rankwatch("trace", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "Try 'rankwatch trace --help' for help." in missing.stderr
    empty = rankwatch("trace", str(tmp_path), "-q")
    assert empty.returncode == 4
    assert (
        empty.stderr.strip() == f"rankwatch: error: {tmp_path}: nothing usable to analyse: "
        "no trace files"
    )
    bad = rankwatch("trace", str(tmp_path), "--step-pattern", "step")
    assert bad.returncode == 2 and "--step-pattern: needs a group" in bad.stderr


CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--virtual-time-budget=10000",
)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_html_report_draws_every_figure_in_headless_chromium(traces, tmp_path: Path) -> None:
    path, _ = traces("faulty")
    out = tmp_path / "trace.html"
    assert rankwatch("trace", str(path), "-q", "--html", str(out)).returncode == 0
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom"]
    done = subprocess.run([*cmd, out.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    plotted = re.findall(r'<div id="fig-[^"]*" class="[^"]*\bjs-plotly-plot\b', done.stdout)
    assert len(plotted) == 3
    assert re.search(r'<div id="render-errors" hidden=""', done.stdout)
