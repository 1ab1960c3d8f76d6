"""The live page: one static file that loads nothing from elsewhere, served by a
real monitor, rendered by a real headless Chromium while a real job streams:
the job's ranks, the lateness heatmap, findings and bandwidth appear, and the
page keeps updating in place."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from serve_support import Job, needs_driver, start_job, start_monitor, wait_for

from rankwatch.serve.web import page

CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
)  # fmt: skip
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)"
)
JOB = Job(ranks=4, steps=3000, pause_us=1000, slow_rank=2, slow_from=200, job_id="page")


def test_page_is_one_file_that_loads_nothing_from_elsewhere() -> None:
    html = page().decode()
    markup = re.sub(r"<script>.*?</script>", "<script></script>", html, flags=re.S)
    assert not re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=", markup)
    assert not re.search(r"https?://", html)
    for section in ("findings", "heatmap", "ranks", "bandwidth"):
        assert f'id="{section}"' in html


def dump_dom(url: str, tmp: Path, budget_ms: int) -> str:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}",
           f"--virtual-time-budget={budget_ms}", "--dump-dom", url]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@needs_chromium
@needs_driver
def test_live_page_shows_ranks_heatmap_findings_and_bandwidth(tmp_path: Path) -> None:
    dump = tmp_path / "job"
    dump.mkdir()
    mon = start_monitor(tmp_path, "--watch", str(dump), "--listen", "none")
    running = start_job(JOB, dump)
    try:
        wait_for(
            lambda: (mon.job("page") or {}).get("findings"), 90, "a finding while the job runs"
        )
        dom = dump_dom(mon.url, tmp_path, 4000)
    finally:
        running.kill()
        mon.stop()
    # every rank in the ranks table
    ranks = re.findall(r'<tr data-rank="(\d+)" data-status="(\w+)"', dom)
    assert sorted(int(r) for r, _ in ranks) == [0, 1, 2, 3], ranks
    # the findings table, the heatmap drawn, bandwidth rows
    assert re.search(r'<tr data-kind="straggler" data-rank="\d"', dom)
    cells = int(re.search(r'<canvas id="heatmap"[^>]*data-cells="(\d+)"', dom).group(1))
    assert cells >= 4
    assert {"AllReduce", "AllGather", "ReduceScatter"} <= set(re.findall(r'data-op="(\w+)"', dom))
    # polled more than once: it updates in place
    updates = int(re.search(r'<body data-updates="(\d+)"', dom).group(1))
    assert updates >= 2
    assert re.search(r'<span id="stale">(.*?)</span>', dom).group(1) == ""  # no fetch failed
