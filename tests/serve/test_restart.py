"""A monitor restart loses no file record, and the plugin reconnects.

A real fake-NCCL job runs for several seconds; mid-job the monitor is killed
(SIGKILL: no goodbye) and a new one starts on the same address. The plugin's
files hold every record of the job (the count the job issued); the plugin
reconnects to the new monitor (its hello says connection 2 or more) and streams
the rest, and the records it could not send while no monitor listened are
counted, by the plugin and on the monitor's page. With --watch, the new monitor
reads the files from their start, so it sees every record.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from serve_support import (
    Job,
    needs_driver,
    record_lines,
    short_socket_path,
    start_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.attach import plugin_streams

pytestmark = needs_driver
JOB = Job(ranks=4, steps=1500, pause_us=1000, job_id="restart")
OPS_PER_STEP = 4  # the fake job's step (fn_job.c)


def ended(mon, key: str) -> dict:  # noqa: ANN001
    return wait_for(
        lambda: (mon.job(key) or {}).get("phase") == "ended" and mon.job(key), 90, f"{key} to end"
    )


@pytest.mark.skipif(not plugin_streams(), reason="the installed plugin cannot stream yet")
def test_restarted_monitor_gets_the_reconnected_streams_and_files_lose_nothing(
    tmp_path: Path,
) -> None:
    address = f"unix:{short_socket_path()}"
    first = start_monitor(tmp_path, listen=address)
    # The smallest stream queue: the second the job runs with no monitor overflows it
    # however slowly a loaded machine runs the job (the default 4 MiB may not fill).
    env = {
        "RANKWATCH_COLLECTOR": address,
        "RANKWATCH_INTERVAL_MS": "200",
        "RANKWATCH_STREAM_QUEUE_BYTES": "128K",
    }
    running = start_job(JOB, tmp_path / "job", env)
    try:
        wait_for(lambda: (first.job("restart") or {}).get("records", {}).get("op", 0) > 500,
                 60, "records in the first monitor")  # fmt: skip
        first.kill()
        time.sleep(1.0)  # records written meanwhile go to the files only
        second = start_monitor(tmp_path, listen=address)
        running.wait(120)
        job = ended(second, "restart")
    finally:
        running.kill()
    second.stop()
    # the files lost nothing: every op the job issued is there
    assert record_lines(tmp_path / "job")["op"] == JOB.ranks * JOB.steps * OPS_PER_STEP
    # every rank reconnected, and the second monitor got the rest of the job
    assert len(job["ranks"]) == JOB.ranks
    assert all(r["stream_connection"] >= 2 for r in job["ranks"]), job["ranks"]
    assert 0 < job["records"]["op"] < JOB.ranks * JOB.steps * OPS_PER_STEP
    # what the plugin could not send while no monitor listened is counted, not hidden
    assert job["stream_gaps"] > 0
    assert any(r["dropped"]["stream"] > 0 for r in job["ranks"])


def test_restarted_watching_monitor_reads_every_record_of_the_files(tmp_path: Path) -> None:
    dump = tmp_path / "job"
    dump.mkdir()
    first = start_monitor(tmp_path, "--watch", str(dump), "--listen", "none")
    running = start_job(JOB, dump)
    try:
        wait_for(lambda: (first.job("restart") or {}).get("records", {}).get("op", 0) > 500,
                 60, "records in the first monitor")  # fmt: skip
        first.kill()
        second = start_monitor(tmp_path, "--watch", str(dump), "--listen", "none")
        running.wait(120)
        job = ended(second, "restart")
    finally:
        running.kill()
    second.stop()
    assert job["records"] == record_lines(dump)
    assert job["records"]["op"] == JOB.ranks * JOB.steps * OPS_PER_STEP
