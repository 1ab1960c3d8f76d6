"""Memory stays bounded, and the service up, under a flood of 10x the rated load.

The rated load of one monitor is RATED records/s (docs/monitor.md: what it
processes, with the detectors, on a 2-core machine). A separate process offers
10x that over 32 connections (a simulated 32-rank job's real record lines), and
drops, as the plugin's bounded stream queue would, what the sockets do not take.
The monitor sheds op lines when its intake is full and counts them; its resident
memory never grows past MEMORY_BOUND above where it started, /healthz answers
throughout, and once the flood stops it drains and takes a normal job again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_support import (
    Job,
    get_status,
    needs_driver,
    run_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.sender import replay
from rankwatch.simulate import SimConfig, simulate

RATED = 10_000  # records/s
FLOOD_S = 8.0
MEMORY_BOUND_MIB = 1024
SENDER = Path(__file__).with_name("flood_sender.py")


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flood-records")
    simulate(SimConfig(ranks=32, hosts=4, tp=2, steps=100, seed=5), out)
    return out


@needs_driver
def test_memory_stays_bounded_under_10x_the_rated_load(records: Path, tmp_path: Path) -> None:
    mon = start_monitor(tmp_path)
    try:
        time.sleep(1.0)
        base = mon.rss_kib()[0]
        peak, health = [base], []
        flooding = threading.Event()
        flooding.set()

        def watch() -> None:
            while flooding.is_set():
                peak[0] = max(peak[0], mon.rss_kib()[0])
                t = time.monotonic()
                health.append((get_status(mon.url + "healthz"), time.monotonic() - t))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        done = subprocess.run(
            [sys.executable, str(SENDER), mon.listen, str(records), str(10 * RATED),
             str(FLOOD_S)],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        sender = json.loads(done.stdout)
        # drained: everything received was processed or counted as shed
        wait_for(lambda: mon.state()["monitor"]["intake_bytes"] == 0, 120, "the intake to drain")
        flooding.clear()
        watcher.join(10)
        state = mon.state()["monitor"]
        grew_mib = (peak[0] - base) / 1024
        print(
            f"offered {sender['offered_per_s']:.0f} records/s for {sender['seconds']:.1f} s; "
            f"received {sum(state['records_received'].values())}, shed "
            f"{state['records_dropped'].get('monitor_overloaded', 0)} by the monitor and "
            f"{sender['dropped_at_sender']} at the sender; peak RSS {peak[0] / 1024:.0f} MiB "
            f"({grew_mib:+.0f} MiB); slowest /healthz {max(s for _, s in health):.2f} s"
        )
        assert sender["offered_per_s"] >= 0.9 * 10 * RATED  # the flood really was 10x
        shed = state["records_dropped"].get("monitor_overloaded", 0) + sender["dropped_at_sender"]
        assert shed > 0  # more than it could take, so something had to give
        assert grew_mib < MEMORY_BOUND_MIB
        assert health and all(code == 200 and s < 2.0 for code, s in health)
        assert mon.proc.poll() is None
    finally:
        flooding.clear()

    # and it still takes a normal job, whole
    try:
        dump = run_job(Job(ranks=2, steps=20, pause_us=500, job_id="after-flood"), tmp_path / "j")
        replay(dump, mon.listen)
        job = wait_for(
            lambda: (
                (mon.job("after-flood") or {}).get("phase") == "ended" and mon.job("after-flood")
            ),
            120,
            "the job after the flood",
        )
        assert job["records"]["op"] == 2 * 20 * 4
    finally:
        mon.stop()
