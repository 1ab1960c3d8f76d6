"""A hang is reported within 2 s of the progress records showing it.

A real fake-NCCL job (4 ranks) where rank 2 enqueues an op whose kernel never
starts at step 30; every rank keeps writing progress records (every 100 ms)
while it waits. The hang finding's evidence names the progress record it was
found on (`detected_at_ns`, the host time the plugin took it): the alert must
reach the monitor's stdout within 2 s of that time, whether the records come
streamed by the plugin or tailed from the files. The same hang is what
`rankwatch analyze` finds in the files afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from serve_support import (
    Job,
    MonitorProc,
    keys,
    needs_driver,
    offline_findings,
    start_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.attach import plugin_streams

pytestmark = needs_driver
HANG = Job(ranks=4, steps=400, pause_us=1000, hang_rank=2, hang_step=30, job_id="hang")
LIMIT_S = 2.0
ENV = {"RANKWATCH_INTERVAL_MS": "100"}


def hang_alert(mon: MonitorProc) -> tuple[float, dict]:
    """When the hang alert reached stdout, and the hang finding."""

    def found() -> tuple[float, dict] | None:
        alerts = [(t, line) for t, line in mon.alerts() if ": hang: " in line]
        if not alerts:
            return None
        job = mon.job(HANG.job_id)
        hangs = job["hangs"] if job else []
        return (alerts[0][0], hangs[0]) if hangs else None

    return wait_for(found, 60, "the hang alert")


def measure(mon: MonitorProc, dump: Path, env: dict[str, str]) -> float:
    running = start_job(HANG, dump, {**ENV, **env})
    try:
        alerted_at, hang = hang_alert(mon)
        shown_at = hang["evidence"]["detected_at_ns"] / 1e9
        latency = alerted_at - shown_at
        print(f"hang reported {latency:.3f} s after the progress record showing it")
        assert hang["rank"] == 2 and hang["cause"] in ("enqueued_not_started", "not_enqueued")
        assert hang["evidence"]["age_s"] >= hang["evidence"]["threshold_s"]
        assert 0 <= latency < LIMIT_S
        time.sleep(0.5)  # a few more progress records for the offline comparison
    finally:
        running.kill()
    offline = [f for f in offline_findings(dump) if f["kind"] == "hang"]
    assert keys([hang]) == keys(offline)
    return latency


@pytest.mark.skipif(not plugin_streams(), reason="the installed plugin cannot stream yet")
def test_hang_streamed_by_the_plugin_is_reported_within_2_s(tmp_path: Path) -> None:
    mon = start_monitor(tmp_path)
    try:
        measure(mon, tmp_path / "job", {"RANKWATCH_COLLECTOR": mon.listen})
    finally:
        mon.stop()


def test_hang_in_watched_files_is_reported_within_2_s(tmp_path: Path) -> None:
    dump = tmp_path / "job"
    dump.mkdir()
    mon = start_monitor(tmp_path, "--watch", str(dump), "--listen", "none")
    try:
        measure(mon, dump, {})
    finally:
        mon.stop()
