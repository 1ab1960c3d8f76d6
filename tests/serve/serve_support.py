"""Running a real `rankwatch monitor` and real fake-NCCL jobs for the serve tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rankwatch.collect.plugin import driver_path, plugin_path
from rankwatch.errors import PluginNotFoundError

REPO_ROOT = Path(__file__).resolve().parents[2]

try:
    driver_path()
    HAVE_DRIVER = True
except PluginNotFoundError:
    HAVE_DRIVER = False

needs_driver = pytest.mark.skipif(not HAVE_DRIVER, reason="fake NCCL driver not built")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll until predicate() is truthy; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_socket_path() -> str:
    """A Unix socket path short enough for sun_path (pytest's tmp paths can be long)."""
    return os.path.join(tempfile.mkdtemp(prefix="rw-"), "m.sock")


@dataclass
class MonitorProc:
    """A `rankwatch monitor` child process, its endpoints and its output lines."""

    proc: subprocess.Popen
    endpoints: dict[str, Any]
    lines: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), stdout line)
    err_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.endpoints["http"]

    @property
    def listen(self) -> str:
        return self.endpoints["listen"][0]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str, headers: dict[str, str] | None = None) -> bytes:
        req = urllib.request.Request(self.url + path.lstrip("/"), headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read()

    def state(self) -> dict[str, Any]:
        return json.loads(self.get("api/state"))

    def metrics(self) -> str:
        return self.get("metrics").decode()

    def job(self, key: str | None = None) -> dict[str, Any] | None:
        jobs = self.state()["jobs"]
        if key is not None:
            jobs = [j for j in jobs if j["key"] == key]
        return jobs[-1] if jobs else None

    def alerts(self) -> list[tuple[float, str]]:
        return [(t, line) for t, line in self.lines if "ALERT" in line]

    def rss_kib(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) of the monitor process, KiB."""
        fields = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                fields[k] = v.strip()
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._readers_done()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._readers_done()

    def _readers_done(self) -> None:
        for t in getattr(self, "_threads", []):
            t.join(10)


def start_monitor(tmp: Path, *args: str, listen: str | None = None) -> MonitorProc:
    """`python -m rankwatch monitor` on a fresh Unix socket (unless `listen` or args give
    one) and a free HTTP port, once it is serving."""
    ready = tmp / f"ready-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "rankwatch", "monitor", "--http", "127.0.0.1:0",
           "--ready-file", str(ready), "--tick", "0.25", *args]  # fmt: skip
    if listen is not None or "--listen" not in args:
        cmd += ["--listen", listen or f"unix:{short_socket_path()}"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    mon = MonitorProc(proc, {})
    mon._threads = [  # type: ignore[attr-defined]
        _reader(proc.stdout, lambda line: mon.lines.append((time.time(), line))),
        _reader(proc.stderr, mon.err_lines.append),
    ]

    def ready_or_dead() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"monitor exited {proc.returncode}: {''.join(mon.err_lines)}")
        return ready.exists()

    wait_for(ready_or_dead, 60, "the monitor to serve")
    mon.endpoints = json.loads(ready.read_text())
    return mon


def _reader(stream, sink: Callable[[str], None]) -> threading.Thread:  # noqa: ANN001
    def run() -> None:
        for line in stream:
            sink(line)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------- fake jobs
@dataclass(frozen=True)
class Job:
    ranks: int = 4
    steps: int = 100
    pause_us: int = 2000
    comm_id: str = "0x5eed0000c0ffee01"
    job_id: str = "serve-test"
    slow_rank: int | None = None
    slow_from: int = 0
    slow_cause: str = "gpu"
    slow_us: int = 2000
    hang_rank: int | None = None
    hang_step: int = 0


def rank_args(job: Job, rank: int, rendezvous: Path) -> list[str]:
    args = [str(driver_path()), "--scenario", "job", "--rank", str(rank),
            "--nranks", str(job.ranks), "--comm-id", job.comm_id, "--steps", str(job.steps),
            "--rendezvous", str(rendezvous), "--interval-sleep-us", str(job.pause_us),
            "--comm-name", "world"]  # fmt: skip
    if job.slow_rank is not None:
        args += ["--slow-rank", str(job.slow_rank), "--slow-from-step", str(job.slow_from),
                 "--slow-cause", job.slow_cause, "--slow-us", str(job.slow_us)]  # fmt: skip
    if job.hang_rank == rank:
        args += ["--hang-at-step", str(job.hang_step)]
    return [*args, str(plugin_path())]


@dataclass
class RunningJob:
    procs: list[subprocess.Popen]
    rendezvous: tempfile.TemporaryDirectory

    def wait(self, timeout: float = 300) -> None:
        for p in self.procs:
            p.wait(timeout)
        self.rendezvous.cleanup()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(30)
        self.rendezvous.cleanup()


def start_job(job: Job, dump: Path, env: dict[str, str] | None = None) -> RunningJob:
    """Every rank of a fake-NCCL job, started (the real plugin records into dump)."""
    dump.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, "RANKWATCH_DUMP_DIR": str(dump), "RANKWATCH_JOB_ID": job.job_id,
            **(env or {})}  # fmt: skip
    rdv = tempfile.TemporaryDirectory(prefix="rankwatch-rdv-")
    procs = [
        subprocess.Popen(
            rank_args(job, r, Path(rdv.name)),
            env=full,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for r in range(job.ranks)
    ]
    return RunningJob(procs, rdv)


def run_job(job: Job, dump: Path, env: dict[str, str] | None = None) -> Path:
    running = start_job(job, dump, env)
    running.wait()
    bad = [p.returncode for p in running.procs if p.returncode != 0]
    assert not bad, f"fake job ranks exited {bad}"
    return dump


def offline_findings(dump: Path) -> list[dict[str, Any]]:
    """`rankwatch analyze --json` findings of the records in dump."""
    done = subprocess.run(
        [sys.executable, "-m", "rankwatch", "analyze", str(dump), "--json", "-q"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["findings"]


def keys(findings: list[dict[str, Any]]) -> list[tuple]:
    return sorted((f["kind"], f["rank"], f["cause"]) for f in findings)


def record_lines(dump: Path) -> dict[str, int]:
    """Complete lines per kind ('op', 'state') in the record files under dump."""
    out = {"op": 0, "state": 0}
    for path in dump.glob("*.log"):
        out["op"] += path.read_bytes().count(b"\n")
    for path in dump.glob("*.rwstate.jsonl"):
        out["state"] += path.read_bytes().count(b"\n")
    return out


def get_status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code
