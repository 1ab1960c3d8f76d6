"""A job whose topology grows while it is watched live: four ranks on one
communicator run first; once the monitor has gone live on them, two more
processes of the same job start on a second communicator. The monitor rebuilds
its detectors over the recent records to take them in, ends up with all six
ranks and both communicators, and finds what `rankwatch analyze` finds in the
files."""

from __future__ import annotations

from pathlib import Path

from serve_support import (
    Job,
    keys,
    needs_driver,
    offline_findings,
    record_lines,
    start_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.attach import plugin_streams

pytestmark = needs_driver
FIRST = Job(ranks=4, steps=1200, pause_us=1000, job_id="grows", comm_id="0x5eed0000c0ffee01")
LATER = Job(ranks=2, steps=400, pause_us=1000, job_id="grows", comm_id="0x7a1e0000c0ffee02")


def test_processes_and_communicators_that_join_later_are_taken_in(tmp_path: Path) -> None:
    dump = tmp_path / "job"
    dump.mkdir()
    streams = plugin_streams()
    mon = start_monitor(tmp_path, *([] if streams else ["--watch", str(dump)]))
    env = {"RANKWATCH_COLLECTOR": mon.listen} if streams else {}
    first = start_job(FIRST, dump, env)
    later = None
    try:
        wait_for(lambda: (mon.job("grows") or {}).get("phase") == "live", 60, "the job live")
        later = start_job(LATER, dump, env)
        later.wait(120)
        first.wait(120)
        job = wait_for(
            lambda: (mon.job("grows") or {}).get("phase") == "ended" and mon.job("grows"),
            90,
            "the job's end",
        )
    finally:
        first.kill()
        if later is not None:
            later.kill()
        mon.stop()
    assert job["rebuilds"] >= 1
    assert job["comms"] == 2
    assert sorted(r["rank"] for r in job["ranks"]) == [0, 1, 2, 3, 4, 5]
    assert job["records"] == record_lines(dump)
    assert keys(job["findings"]) == keys(offline_findings(dump))
