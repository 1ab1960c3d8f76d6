"""A monitor beside one job (`rankwatch run --monitor`): started as a child process
before the job, stopped after it, printing its findings.

The monitor listens on a Unix socket in the dump directory and the job's ranks
get RANKWATCH_COLLECTOR pointing at it. A plugin built without the stream
sender cannot stream: the monitor then tails the dump directory instead, which
gives the same records a little later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rankwatch.errors import ConfigError

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
SUN_PATH_MAX = 100  # bytes of a Unix socket path, with room to spare (Linux: 108)


def plugin_streams() -> bool:
    """Whether the installed plugin has the stream sender (it reads RANKWATCH_COLLECTOR)."""
    from rankwatch.collect.plugin import plugin_path

    try:
        return b"RANKWATCH_COLLECTOR" in plugin_path().read_bytes()
    except OSError:
        return False


def _socket_path(dump_dir: Path) -> Path:
    path = dump_dir / "monitor.sock"
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path
    return Path(tempfile.mkdtemp(prefix="rankwatch-")) / "monitor.sock"


@dataclass
class AttachedMonitor:
    proc: subprocess.Popen
    env: dict[str, str]  # what the job's ranks need to stream to it
    url: str | None
    ready_file: Path

    def stop(self, stream: TextIO) -> int:
        """Stop the monitor (it prints each job's findings) and wait for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            print("rankwatch: the monitor did not stop in time and was killed", file=stream)
        self.ready_file.unlink(missing_ok=True)
        return code


def start_monitor(dump_dir: Path, http: str, stream: TextIO) -> AttachedMonitor:
    """Start `rankwatch monitor` for a job writing into dump_dir (see module doc)."""
    ready = dump_dir / "monitor.json"
    ready.unlink(missing_ok=True)
    args = [
        sys.executable,
        "-m",
        "rankwatch",
        "monitor",
        "--http",
        http,
        "--ready-file",
        str(ready),
    ]
    env: dict[str, str] = {}
    if plugin_streams():
        sock = _socket_path(dump_dir)
        args += ["--listen", f"unix:{sock}"]
        env["RANKWATCH_COLLECTOR"] = f"unix:{sock}"
    else:
        args += ["--listen", "none", "--watch", str(dump_dir)]
    # its own session: Ctrl-C meant for the job must not stop the monitor before the
    # job's last records are in; it is stopped after the job.
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
    endpoints = _wait_ready(proc, ready)
    url = endpoints.get("http")
    how = "streams" if env else "record files (this plugin cannot stream)"
    print(f"rankwatch: monitor reading the job's {how}; live page: {url}", file=stream)
    return AttachedMonitor(proc, env, url, ready)


def _wait_ready(proc: subprocess.Popen, ready: Path) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists():
            return json.loads(ready.read_text())
        if proc.poll() is not None:
            raise ConfigError(f"the monitor exited ({proc.returncode}) before serving")
        time.sleep(0.05)
    proc.kill()
    raise ConfigError(f"the monitor did not start within {READY_TIMEOUT_S:.0f} s")
