"""The stream protocol, against a real monitor: good lines in, everything bad
rejected and counted by reason, the service never going down.

Lines are real plugin records (a fake-NCCL job's files) sent by the Python
sender of rankwatch.serve.sender, frame by frame, as docs/stream-protocol.md
describes."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_support import (
    HAVE_DRIVER,
    Job,
    MonitorProc,
    get_status,
    run_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.protocol import (
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    ProtocolError,
    encode_frame,
    hello_line,
    parse_hello,
    split_lines,
)
from rankwatch.serve.sender import StreamSender, connect, frames_of, process_files


def samples(text: str, name: str) -> dict[tuple, float]:
    """Samples of one metric family: label items -> value."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def metric(mon: MonitorProc, name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    return samples(mon.metrics(), name).get(want, 0.0)


# ---------------------------------------------------------------------- pure parts
def test_hello_is_parsed_and_a_newer_protocol_is_rejected_naming_both_versions() -> None:
    hello = parse_hello(hello_line("node7", 42, job_id="j1", token="t", connection=3, dropped=5))
    assert (hello.hostname, hello.pid, hello.job_id, hello.connection) == ("node7", 42, "j1", 3)
    assert hello.stream_dropped_records == 5
    with pytest.raises(ProtocolError) as info:
        parse_hello(hello_line("node7", 42, protocol=PROTOCOL_VERSION + 1))
    assert info.value.reason == "newer_protocol"
    assert f"protocol {PROTOCOL_VERSION + 1}" in info.value.message
    assert f"protocol {PROTOCOL_VERSION})" in info.value.message


@pytest.mark.parametrize(
    "payload",
    [b"", b"{}\n", b'{"kind":"hello"}\n', b"not json\n", hello_line("h", 1)[:-1],
     hello_line("h", 1) + hello_line("h", 1), b'{"kind":"hello","protocol":"1"}\n'],
)  # fmt: skip
def test_bad_hellos_are_rejected(payload: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_hello(payload)
    assert info.value.reason == "bad_hello"


def test_lines_split_by_kind_and_an_unterminated_piece_is_counted_not_kept() -> None:
    op = b'{"header":{"id":"0x1"},"rankwatch":{}}'
    state = b'{"schema":1,"kind":"progress"}'
    lines = split_lines(op + b"\n" + state + b"\n\n" + op + b"\n" + b'{"schema":1,"ki')
    assert (lines.n_ops, lines.n_state, lines.unterminated) == (2, 1, 1)
    assert lines.ops == op + b"\n" + op + b"\n"
    assert lines.state == state + b"\n"


def test_frames_never_exceed_the_limit_and_end_at_line_ends() -> None:
    line = b"x" * 1000 + b"\n"
    data = line * 10_000  # about 10 MB
    frames = list(frames_of(data, limit=MAX_PAYLOAD))
    assert len(frames) == 3
    assert all(len(f) <= MAX_PAYLOAD and f.endswith(b"\n") for f in frames)
    assert b"".join(frames) == data
    with pytest.raises(ValueError):
        list(frames_of(b"y" * 100 + b"\n", limit=50))


# ---------------------------------------------------------------------- a real monitor
@pytest.fixture(scope="module")
def job_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_DRIVER:
        pytest.skip("fake NCCL driver not built")
    return run_job(Job(ranks=2, steps=30, pause_us=500), tmp_path_factory.mktemp("proto-job"))


def _raw(mon: MonitorProc) -> socket.socket:
    for _ in range(100):  # a full accept backlog refuses a Unix connect for a moment
        try:
            return connect(mon.listen)
        except BlockingIOError:
            time.sleep(0.05)
    return connect(mon.listen)


def _closed(sock: socket.socket, timeout: float = 10) -> bool:
    """Whether the monitor closed this connection (it never sends anything)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_bad_frames_are_rejected_and_counted_and_good_streams_keep_flowing(
    job_files: Path, tmp_path: Path
) -> None:
    mon = start_monitor(tmp_path)
    try:
        proc = process_files(job_files)[0]
        lines = b"".join(line for _, line in proc.lines())
        good_ops = sum(1 for line in lines.splitlines() if line.startswith(b'{"header"'))

        # an oversized frame: the connection is closed at its header, nothing read
        s = _raw(mon)
        s.sendall(encode_frame(hello_line(proc.host, proc.pid, job_id="serve-test")))
        s.sendall(struct.pack(">I", MAX_PAYLOAD + 1) + b"x" * 1000)
        assert _closed(s)
        # a hello of a newer protocol
        s = _raw(mon)
        s.sendall(encode_frame(hello_line("h", 1, protocol=PROTOCOL_VERSION + 1)))
        assert _closed(s)
        # not a hello at all
        s = _raw(mon)
        s.sendall(encode_frame(b'{"header":{}}\n'))
        assert _closed(s)
        # a frame cut short by the sender going away
        s = _raw(mon)
        s.sendall(encode_frame(hello_line("h", 2)) + struct.pack(">I", 100) + b"{")
        s.close()

        # a good connection whose frames carry malformed lines among good ones
        sender = StreamSender(mon.listen, proc.host, proc.pid, job_id="serve-test")
        junk = b'not json\n{"header": 5}\n\xff\xfe\n{"schema":1,"kind":"progress"}\n'
        half = lines.index(b"\n", len(lines) // 2) + 1
        sender.send(lines[:half] + junk + lines[half:])
        sender.close()

        def counted() -> bool:
            m = mon.metrics()
            rej = samples(m, "rankwatch_frames_rejected_total")
            return rej.get((("reason", "truncated"),), 0) >= 1

        wait_for(counted, 15, "the truncated frame to be counted")
        wait_for(
            lambda: (mon.job("serve-test") or {}).get("records", {}).get("op", 0) >= good_ops,
            30,
            "every good op line to be processed",
        )
        m = mon.metrics()
        rej = samples(m, "rankwatch_frames_rejected_total")
        for reason in ("oversized", "newer_protocol", "bad_hello", "truncated"):
            assert rej[(("reason", reason),)] == 1, (reason, rej)
        lines_rej = samples(m, "rankwatch_lines_rejected_total")
        assert lines_rej[(("reason", "malformed"),)] == 2  # "not json" and the bad bytes
        assert lines_rej[(("reason", "not_a_record"),)] == 1  # {"header": 5}
        assert lines_rej[(("reason", "bad_state_record"),)] == 1  # a progress with no keys
        assert mon.job("serve-test")["records"]["op"] == good_ops  # nothing good was lost
        assert mon.proc.poll() is None
        errors = "".join(mon.err_lines)
        assert "more than the 4,194,304 allowed" in errors
        assert "newer than the newest this monitor reads" in errors
    finally:
        mon.stop()


def test_a_wrong_or_missing_token_closes_the_connection(job_files: Path, tmp_path: Path) -> None:
    mon = start_monitor(tmp_path, "--token", "s3cret")
    try:
        proc = process_files(job_files)[0]
        for token in (None, "wrong"):
            s = _raw(mon)
            s.sendall(encode_frame(hello_line(proc.host, proc.pid, token=token)))
            assert _closed(s)
        sender = StreamSender(mon.listen, proc.host, proc.pid, job_id="j", token="s3cret")
        sender.send(b"".join(line for _, line in proc.lines()))
        sender.close()
        wait_for(lambda: (mon.job("j") or {}).get("records", {}).get("op"), 30, "records")
        rej = samples(mon.metrics(), "rankwatch_frames_rejected_total")
        assert rej[(("reason", "bad_token"),)] == 2
    finally:
        mon.stop()


def test_many_bad_connections_at_once_never_stop_the_service(tmp_path: Path) -> None:
    mon = start_monitor(tmp_path)
    try:
        for i in range(200):
            s = _raw(mon)
            s.sendall(struct.pack(">I", 0xFFFFFFFF) if i % 2 else b"\x00\x00")
            s.close()
        wait_for(
            lambda: sum(samples(mon.metrics(), "rankwatch_frames_rejected_total").values()) >= 200,
            30,
            "200 rejections",
        )
        assert get_status(mon.url + "healthz") == 200
        # the log says so, but not 200 times
        assert sum("closed" in line for line in mon.err_lines) <= 4
    finally:
        mon.stop()


def test_a_listener_beyond_loopback_needs_a_token() -> None:
    for args in (["--listen", "tcp://0.0.0.0:0", "--http", "none"],
                 ["--listen", "none", "--http", "0.0.0.0:0", "--watch", "."]):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "rankwatch", "monitor", *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "is not loopback: set a shared token" in done.stderr


def test_http_beyond_loopback_needs_the_token(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "monitor", "--listen", "none", "--watch",
         str(tmp_path), "--http", "0.0.0.0:0", "--token", "tok", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(ready.exists, 60, "the monitor to serve")
        port = json.loads(ready.read_text())["http"].rsplit(":", 1)[1].strip("/")
        base = f"http://127.0.0.1:{port}/"
        assert get_status(base + "metrics") == 401
        assert get_status(base + "metrics", {"Authorization": "Bearer nope"}) == 401
        assert get_status(base + "metrics", {"Authorization": "Bearer tok"}) == 200
        assert get_status(base + "api/state?token=tok") == 200
    finally:
        proc.terminate()
        proc.wait(60)


def test_tcp_listener_on_loopback_takes_streams(job_files: Path, tmp_path: Path) -> None:
    mon = start_monitor(tmp_path, listen="tcp://127.0.0.1:0")
    try:
        assert mon.listen.startswith("tcp://127.0.0.1:")
        proc = process_files(job_files)[0]
        sender = StreamSender(mon.listen, proc.host, proc.pid, job_id="tcp-job")
        sender.send(b"".join(line for _, line in proc.lines()))
        sender.close()
        wait_for(lambda: (mon.job("tcp-job") or {}).get("records", {}).get("op"), 30, "records")
        assert time.time() - mon.job("tcp-job")["last_record"] < 60
    finally:
        mon.stop()
