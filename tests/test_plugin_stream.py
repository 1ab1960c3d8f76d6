"""The plugin's streaming sink (docs/stream-protocol.md), end to end.

The real plugin runs under the fake NCCL driver and streams to a collector written
here from the protocol document alone: a socket server thread that decodes frames
(4-byte big-endian length, then whole JSON lines) and keeps every line it received.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from driver import driver_binary, issued_colls, recorded_colls, run_driver
from rankwatch import __version__
from rankwatch.collect.env import plugin_env
from rankwatch.collect.plugin import plugin_path
from rankwatch.errors import ConfigError

MAX_PAYLOAD = 4 * 1024 * 1024
MIN_QUEUE = 128 * 1024  # the smallest RANKWATCH_STREAM_QUEUE_BYTES the plugin accepts

# A job of one rank that runs for about 6 s at a steady ~800 op records per second
# of wall time on an idle machine (4 ops a step, 5 ms apart).
STEADY_JOB = ("--scenario", "job", "--nranks", "1", "--steps", "300", "--interval-sleep-us", "5000")


@dataclass
class Connection:
    """One connection as the collector saw it."""

    lines: list[bytes] = field(default_factory=list)
    frames: int = 0
    bytes: int = 0
    closed: bool = False  # the plugin closed it (EOF)
    errors: list[str] = field(default_factory=list)

    @property
    def hello(self) -> dict[str, Any]:
        return json.loads(self.lines[0])

    @property
    def records(self) -> list[bytes]:
        return self.lines[1:]


class Collector:
    """A minimal stream receiver: accepts connections and decodes their frames.

    With read=False it accepts and then never reads, like a collector that hangs.
    stop() closes everything at once, unread bytes included, like a killed one.
    """

    def __init__(self, address: str, *, read: bool = True) -> None:
        self.read = read
        self.connections: list[Connection] = []
        self._idle: list[socket.socket] = []
        if address.startswith("unix:"):
            self.path: str | None = address[5:]
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(self.path)
            self.address = address
        else:
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            self.path = None
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, int(port)))
            self.port = self._listener.getsockname()[1]
            self.address = f"tcp://{host}:{self.port}"
        self._listener.listen(8)
        self._listener.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.02):
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._receive(sel, *key.data)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            for sock in self._idle:
                sock.close()
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        sock, _ = self._listener.accept()
        conn = Connection()
        self.connections.append(conn)
        if not self.read:
            self._idle.append(sock)
            return
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, (conn, sock, bytearray()))

    def _receive(
        self, sel: selectors.BaseSelector, conn: Connection, sock: socket.socket, buf: bytearray
    ) -> None:
        data = sock.recv(1 << 20)
        if not data:
            if buf:
                conn.errors.append(f"connection closed inside a frame ({len(buf)} bytes)")
            conn.closed = True
            sel.unregister(sock)
            sock.close()
            return
        conn.bytes += len(data)
        buf += data
        while len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big")
            if size > MAX_PAYLOAD or size == 0:
                conn.errors.append(f"frame of {size} bytes")
                sel.unregister(sock)
                sock.close()
                return
            if len(buf) < 4 + size:
                break
            payload = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            conn.frames += 1
            if not payload.endswith(b"\n"):
                conn.errors.append("a frame that does not end with a whole line")
            lines = payload.splitlines(keepends=True)
            if conn.frames == 1 and len(lines) != 1:
                conn.errors.append(f"the first frame carries {len(lines)} lines, not the hello")
            conn.lines.extend(lines)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._listener.close()
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)

    def wait_for(self, what: Callable[[], bool], timeout: float = 20) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what():
                return True
            time.sleep(0.02)
        return what()

    def all_closed(self) -> bool:
        return bool(self.connections) and all(c.closed for c in self.connections)

    def lines_received(self) -> int:
        return sum(len(c.records) for c in self.connections)


def file_lines(dump: Path, pattern: str) -> list[bytes]:
    return [line for f in sorted(dump.glob(pattern)) for line in f.read_bytes().splitlines(True)]


def op_lines(dump: Path) -> list[bytes]:
    return file_lines(dump, "*.log")


def state_lines(dump: Path) -> list[bytes]:
    return file_lines(dump, "*.rwstate.jsonl")


def last_stats(dump: Path) -> dict[str, Any]:
    stats = [json.loads(s) for s in state_lines(dump) if b'"kind":"stats"' in s]
    assert stats and stats[-1]["reason"] == "exit"
    return stats[-1]


def only(lines: list[bytes], keep: set[bytes]) -> list[bytes]:
    return [line for line in lines if line in keep]


def start_driver(dump: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    full_env = {**os.environ, "RANKWATCH_DUMP_DIR": str(dump), **env}
    return subprocess.Popen(
        [str(driver_binary()), *args, str(plugin_path())],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_file_lines(dump: Path, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(op_lines(dump)) < n:
        time.sleep(0.02)
    assert len(op_lines(dump)) >= n, "the job did not write records"


def collector_address(tmp_path: Path, transport: str) -> str:
    if transport == "unix":
        return f"unix:{tmp_path / 'collector.sock'}"
    return "tcp://127.0.0.1:0"


def plugin_address(collector: Collector, transport: str) -> str:
    # tcp-name makes the plugin resolve a host name (on its writer thread)
    if transport == "tcp-name":
        return f"tcp://localhost:{collector.port}"
    return collector.address


# ---------------------------------------------------------------- (a) every line


@pytest.mark.parametrize("transport", ["unix", "tcp", "tcp-name"])
def test_every_file_line_arrives_in_the_stream_byte_identical(
    tmp_path: Path, transport: str
) -> None:
    # Given a collector, and a job whose plugin streams to it with a token
    collector = Collector(collector_address(tmp_path, transport))
    dump = tmp_path / "dump"
    env = {
        "RANKWATCH_COLLECTOR": plugin_address(collector, transport),
        "RANKWATCH_COLLECTOR_TOKEN": 'tok "en"\\',
        "RANKWATCH_JOB_ID": "job-42",
    }
    try:
        run = run_driver(dump, "--scenario", "workload", env=env)
        assert run.returncode == 0, run.stderr
        assert collector.wait_for(collector.all_closed), "the plugin did not close its stream"
    finally:
        collector.stop()
    ops, states = op_lines(dump), state_lines(dump)
    assert ops and states
    # Then one connection, opened with a hello that names this process and its files
    (conn,) = collector.connections
    assert conn.errors == []
    (op_file,) = dump.glob("*.log")
    (state_file,) = dump.glob("*.rwstate.jsonl")
    first_op = json.loads(ops[0])
    assert conn.hello == {
        "kind": "hello",
        "protocol": 1,
        "schema": 1,
        "hostname": first_op["metadata"]["hostname"],
        "pid": first_op["metadata"]["pid"],
        "job_id": "job-42",
        "plugin_version": __version__,
        "ops_file": op_file.name,
        "state_file": state_file.name,
        "token": 'tok "en"\\',
        "connection": 1,
        "stream_dropped_records": 0,
    }
    # And every line of both files, byte for byte, each file's lines in file order
    assert sorted(conn.records) == sorted(ops + states)
    assert only(conn.records, set(ops)) == ops
    assert only(conn.records, set(states)) == states
    # And the last stats record accounts for every line before it, and for every
    # byte the collector received before the frame that carried it
    stats = last_stats(dump)
    assert conn.records[-1] == states[-1]
    assert stats["stream_sent_records"] == len(ops) + len(states) - 1
    assert stats["stream_dropped_records"] == 0
    assert stats["stream_reconnects"] == 0
    assert stats["stream_sent_bytes"] == conn.bytes - 4 - len(states[-1])


# ---------------------------------------------------------------- (b) late collector


def test_a_collector_started_mid_run_gets_the_later_records_and_the_drop_count(
    tmp_path: Path,
) -> None:
    # Given a job streaming to a collector that is not there yet, with the smallest queue
    address = collector_address(tmp_path, "unix")
    dump = tmp_path / "dump"
    env = {"RANKWATCH_COLLECTOR": address, "RANKWATCH_STREAM_QUEUE_BYTES": str(MIN_QUEUE)}
    proc = start_driver(dump, *STEADY_JOB, "--verbose", env=env)
    collector = None
    try:
        # When the collector starts once the job has written more than the queue holds
        wait_for_file_lines(dump, 2 * MIN_QUEUE // 1000)
        collector = Collector(address)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert collector.wait_for(collector.all_closed)
    finally:
        proc.kill()
        if collector:
            collector.stop()
    ops, states = op_lines(dump), state_lines(dump)
    stats = last_stats(dump)
    # Then the plugin said once that it could not connect, and kept retrying
    assert stderr.count("cannot connect to the collector") == 1
    (conn,) = collector.connections
    assert conn.errors == []
    assert conn.hello["connection"] == 1
    # And it connected: the hello counts what was dropped while nobody listened
    assert 0 < conn.hello["stream_dropped_records"] <= stats["stream_dropped_records"]
    # And from then on every record arrived: each file's tail, up to its last line
    received_ops = only(conn.records, set(ops))
    received_states = only(conn.records, set(states))
    assert received_ops and received_ops == ops[len(ops) - len(received_ops) :]
    assert received_states == states[len(states) - len(received_states) :]
    assert len(received_ops) < len(ops)
    # And the counts add up: sent + dropped = every line before the last stats record
    lines_before = len(ops) + len(states) - 1
    assert stats["stream_sent_records"] + stats["stream_dropped_records"] == lines_before
    assert stats["stream_sent_records"] == len(conn.records) - 1


def test_an_absent_collector_costs_only_stream_records(tmp_path: Path) -> None:
    # Given a collector address where nothing ever listens
    dump = tmp_path / "dump"
    env = {"RANKWATCH_COLLECTOR": f"unix:{tmp_path / 'nobody.sock'}"}
    run = run_driver(dump, "--scenario", "workload", env=env)
    # Then the job and its files are as without a collector, and every line is dropped
    assert run.returncode == 0, run.stderr
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)
    stats = last_stats(dump)
    lines_before = len(op_lines(dump)) + len(state_lines(dump)) - 1
    assert stats["stream_dropped_records"] == lines_before
    assert stats["stream_sent_records"] == stats["stream_sent_bytes"] == 0


# ---------------------------------------------------------------- (c) restart


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_restarted_collector_gets_a_second_connection_and_nothing_is_lost_from_files(
    tmp_path: Path, transport: str
) -> None:
    first = Collector(collector_address(tmp_path, transport))
    dump = tmp_path / "dump"
    proc = start_driver(dump, *STEADY_JOB, env={"RANKWATCH_COLLECTOR": first.address})
    second = None
    try:
        # Given a job streaming to a collector that has received some records
        assert first.wait_for(lambda: first.lines_received() >= 100)
        # When the collector is killed, the job writes on, and the collector restarts
        first.stop()
        written = len(op_lines(dump))
        wait_for_file_lines(dump, written + 80)
        second = Collector(first.address)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        assert second.wait_for(second.all_closed)
    finally:
        proc.kill()
        if second:
            second.stop()
    # Then the plugin reconnected once, saying so in the hello
    (conn1,) = first.connections
    (conn2,) = second.connections
    assert conn2.errors == []
    assert (conn1.hello["connection"], conn2.hello["connection"]) == (1, 2)
    stats = last_stats(dump)
    assert stats["stream_reconnects"] == 1
    # And the files are complete: one record per op the job issued
    summary = json.loads(stdout.strip().splitlines()[-1])
    ops, states = op_lines(dump), state_lines(dump)
    assert recorded_colls([json.loads(x) for x in ops]) == issued_colls(summary)
    # And what was queued while the collector was away arrived after the restart
    # (the default queue holds it all); only what sat unread in the killed
    # collector's socket is missing, which is one run of consecutive records
    assert stats["stream_dropped_records"] == 0
    lines_before = len(ops) + len(states) - 1
    assert stats["stream_sent_records"] == lines_before
    received = conn1.records + conn2.records
    assert len(received) == len(set(received))
    assert set(received) <= set(ops + states)
    missing = [i for i, line in enumerate(ops) if line not in set(received)]
    assert missing == list(range(missing[0], missing[-1] + 1)) if missing else True
    after_restart = only(conn2.records, set(ops))
    assert after_restart and after_restart == ops[len(ops) - len(after_restart) :]
    assert len(received) <= stats["stream_sent_records"] + 1


# ---------------------------------------------------------------- (d) a stuck collector


# Runs a command and writes its peak RSS (KiB) to argv[1]. The measurement needs a
# small parent: Linux carries the peak RSS of the address space a process had
# before exec into its own, so the driver is not forked from the test process.
PEAK_RSS = """
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
"""


def run_measured(dump: Path, *args: str, env: dict[str, str]) -> tuple[float, int, str, str]:
    """(wall seconds, peak RSS in KiB, stdout, stderr) of one driver run."""
    rss_file = dump.parent / f"{dump.name}.rss"
    full_env = {**os.environ, "RANKWATCH_DUMP_DIR": str(dump), **env}
    command = [str(driver_binary()), *args, str(plugin_path())]
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(rss_file), *command],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    return wall, int(rss_file.read_text()), proc.stdout, proc.stderr


BURST = ("--scenario", "basic", "--ops", "40000")  # about 48 MB of op records, fast


@pytest.fixture(scope="module")
def burst_baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[float, int]:
    dump = tmp_path_factory.mktemp("baseline") / "dump"
    wall, rss, _, _ = run_measured(dump, *BURST, env={})
    return wall, rss


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_collector_that_never_reads_neither_slows_the_job_nor_grows_its_memory(
    tmp_path: Path, transport: str, burst_baseline: tuple[float, int]
) -> None:
    # Given a collector that accepts and never reads, and a 1 MiB stream queue
    collector = Collector(collector_address(tmp_path, transport), read=False)
    dump = tmp_path / "dump"
    env = {"RANKWATCH_COLLECTOR": collector.address, "RANKWATCH_STREAM_QUEUE_BYTES": "1M"}
    try:
        wall, rss, stdout, _ = run_measured(dump, *BURST, env=env)
    finally:
        collector.stop()
    base_wall, base_rss = burst_baseline
    assert len(collector.connections) == 1
    # Then the job takes about as long as without a collector
    assert wall < 1.5 * base_wall + 1.0, (wall, base_wall)
    # And every op is in the files
    summary = json.loads(stdout.strip().splitlines()[-1])
    ops = op_lines(dump)
    assert recorded_colls([json.loads(x) for x in ops]) == issued_colls(summary)
    produced = sum(map(len, ops))
    assert produced > 40 * 2**20
    # And what the socket could not take was dropped and counted, not kept:
    # memory grew by about the queue, not by the tens of MB streamed
    stats = last_stats(dump)
    assert stats["dropped_pool_full"] == 0
    assert stats["stream_dropped_records"] > len(ops) // 2
    assert stats["stream_sent_bytes"] < produced // 2
    assert rss - base_rss < 8 * 1024, (rss, base_rss)
    lines_before = len(ops) + len(state_lines(dump)) - 1
    assert stats["stream_sent_records"] + stats["stream_dropped_records"] <= lines_before
    # (what is neither is one partly sent frame, which the plugin must finish or never start)
    assert lines_before - stats["stream_sent_records"] - stats["stream_dropped_records"] <= 300


# ---------------------------------------------------------------- (e) bad settings


@pytest.mark.parametrize(
    ("setting", "warning"),
    [
        ({"RANKWATCH_COLLECTOR": "http://127.0.0.1:80"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "tcp://127.0.0.1"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "tcp://:9000"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "tcp://127.0.0.1:0"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "tcp://127.0.0.1:70000"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "tcp://127.0.0.1:9x"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "tcp://::1:9000"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "unix:"}, "RANKWATCH_COLLECTOR="),
        ({"RANKWATCH_COLLECTOR": "unix:/" + "x" * 120}, "RANKWATCH_COLLECTOR="),
        (
            {"RANKWATCH_COLLECTOR": "unix:/tmp/c.sock", "RANKWATCH_COLLECTOR_TOKEN": "t" * 257},
            "RANKWATCH_COLLECTOR_TOKEN is longer",
        ),
        (
            {"RANKWATCH_COLLECTOR": "unix:/tmp/c.sock", "RANKWATCH_STREAM_QUEUE_BYTES": "4096"},
            "RANKWATCH_STREAM_QUEUE_BYTES=",
        ),
        (
            {"RANKWATCH_COLLECTOR": "unix:/tmp/c.sock", "RANKWATCH_STREAM_QUEUE_BYTES": "lots"},
            "RANKWATCH_STREAM_QUEUE_BYTES=",
        ),
        (
            {"RANKWATCH_COLLECTOR": "unix:/tmp/c.sock", "RANKWATCH_STREAM_QUEUE_BYTES": "2G"},
            "RANKWATCH_STREAM_QUEUE_BYTES=",
        ),
    ],
)
def test_an_invalid_stream_setting_warns_once_and_leaves_recording_alone(
    tmp_path: Path, setting: dict[str, str], warning: str
) -> None:
    run = run_driver(tmp_path, "--scenario", "workload", "--verbose", env=setting)
    # Then the job and its files are fine
    assert run.returncode == 0, run.stderr
    assert recorded_colls(run.op_records()) == issued_colls(run.summary)
    # And NCCL's log says once what was wrong, never showing the token
    assert run.stderr.count(warning) == 1, run.stderr
    assert "streaming off" in run.stderr
    assert "t" * 257 not in run.stderr
    assert "streaming records to" not in run.stderr
    # And nothing was streamed or counted
    stats = run.state_records("stats")[-1]
    assert [stats[k] for k in ("stream_sent_records", "stream_dropped_records")] == [0, 0]
    assert [stats[k] for k in ("stream_sent_bytes", "stream_reconnects")] == [0, 0]


def test_valid_queue_sizes_take_a_suffix(tmp_path: Path) -> None:
    for value in ("128K", "4m", "1G", str(MIN_QUEUE)):
        dump = tmp_path / value
        env = {
            "RANKWATCH_COLLECTOR": f"unix:{tmp_path / 'nobody.sock'}",
            "RANKWATCH_STREAM_QUEUE_BYTES": value,
        }
        run = run_driver(dump, "--scenario", "basic", "--verbose", env=env)
        assert run.returncode == 0, run.stderr
        assert "RANKWATCH_STREAM_QUEUE_BYTES" not in run.stderr
        assert "cannot connect to the collector" in run.stderr


# ---------------------------------------------------------------- plugin_env


def test_plugin_env_streaming_settings_reach_the_plugin(tmp_path: Path) -> None:
    # Given the variables rankwatch's Python side produces for a collector
    collector = Collector(collector_address(tmp_path, "unix"))
    env = plugin_env(
        tmp_path / "dump",
        collector=collector.address,
        collector_token="s3cret",
        stream_queue_bytes=256 * 1024,
    )
    assert env["RANKWATCH_STREAM_QUEUE_BYTES"] == str(256 * 1024)
    try:
        run = run_driver(tmp_path / "dump", "--scenario", "basic", env=env)
        assert run.returncode == 0, run.stderr
        assert collector.wait_for(collector.all_closed)
    finally:
        collector.stop()
    # Then the plugin streams with them
    (conn,) = collector.connections
    assert conn.hello["token"] == "s3cret"
    assert len(conn.records) == len(op_lines(tmp_path / "dump")) + len(
        state_lines(tmp_path / "dump")
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("collector", "http://127.0.0.1:80"),
        ("collector", "tcp://127.0.0.1"),
        ("collector", "tcp://::1:9000"),
        ("collector", "tcp://127.0.0.1:0"),
        ("collector", "tcp://127.0.0.1:70000"),
        ("collector", "unix:"),
        ("collector", "unix:/" + "x" * 107),
        ("collector_token", "t" * 257),
        ("stream_queue_bytes", 4096),
        ("stream_queue_bytes", 2 * 1024**3),
    ],
)
def test_plugin_env_rejects_what_the_plugin_would_ignore(
    tmp_path: Path, setting: str, value: Any
) -> None:
    with pytest.raises(ConfigError) as err:
        plugin_env(tmp_path, **{setting: value})
    assert err.value.field == setting


@pytest.mark.parametrize(
    "collector", ["unix:/run/rw.sock", "tcp://node3:7070", "tcp://10.0.0.2:1", "tcp://[::1]:65535"]
)
def test_plugin_env_passes_valid_collectors_through(tmp_path: Path, collector: str) -> None:
    assert plugin_env(tmp_path, collector=collector)["RANKWATCH_COLLECTOR"] == collector
