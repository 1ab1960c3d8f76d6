"""`rankwatch run --monitor -- CMD`: the job and a monitor for it, one command.

CMD is a real 4-rank fake-NCCL job (one shell starting every rank). The monitor
starts before it (its live page's address is printed), gets every record the
job writes, and when the job ends it is stopped and prints each job's findings;
the command exits with the job's exit code.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from serve_support import Job, needs_driver, rank_args, record_lines

pytestmark = needs_driver
JOB = Job(ranks=4, steps=150, pause_us=1000, slow_rank=2, slow_from=60, job_id="run-monitor")


def test_run_monitor_watches_the_job_and_prints_its_findings(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    with tempfile.TemporaryDirectory(prefix="rankwatch-rdv-") as rdv:
        ranks = [shlex.join(rank_args(JOB, r, Path(rdv))) for r in range(JOB.ranks)]
        script = " & ".join(ranks) + " & wait"
        done = subprocess.run(
            [sys.executable, "-m", "rankwatch", "run", "--monitor", "--dump-dir", str(dump),
             "--job-id", JOB.job_id, "--interval-ms", "200", "--", "sh", "-c", script],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"monitor reading the job's .*; live page: http://127\.0\.0\.1:\d+/", done.stderr
    )
    files = record_lines(dump)
    assert files["op"] == JOB.ranks * JOB.steps * 4
    summary = re.search(
        rf"rankwatch monitor: job {JOB.job_id}: (\d+) ranks, (\d+) op records, (\d+) finding",
        done.stdout,
    )
    assert summary, done.stdout
    assert int(summary.group(1)) == JOB.ranks
    assert int(summary.group(2)) == files["op"]  # the monitor saw every record
    # the findings the monitor printed are its findings of this job
    listed = re.findall(rf"  job {JOB.job_id}: (\w+): rank (\d+)", done.stdout)
    assert len(listed) == int(summary.group(3))
    assert "records in " in done.stderr  # and run still says where the files are
