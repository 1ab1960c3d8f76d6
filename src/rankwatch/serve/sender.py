"""A sender of the stream protocol in Python: what the plugin's writer thread does,
for replaying record files into a monitor (tests, demos, a relay).

`StreamSender` is one connection (hello, then frames of whole lines, none above
the payload limit). `replay(directory, address)` sends every process's record
files over its own connection, lines merged in the order they were written (op
records by their dump time, state records by their own time), optionally paced
at `speed` times the recorded pace.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rankwatch.serve.protocol import MAX_PAYLOAD, encode_frame, hello_line

_DUMP_US = re.compile(rb'"dump_timestamp_us":(\d+)')
_TS_NS = re.compile(rb'"ts_ns":(\d+)')
_NAME = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log$")
_JOB = re.compile(rb'"job_id":"((?:[^"\\]|\\.)*)"')


def connect(address: str, timeout: float = 5.0) -> socket.socket:
    """A connected socket for `unix:/path` or `tcp://host:port`."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(address[len("unix:") :])
    elif address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    else:
        raise ValueError(f"{address!r}: expected unix:/path or tcp://host:port")
    sock.settimeout(None)
    return sock


class StreamSender:
    """One connection: hello first, then frames of whole lines."""

    def __init__(
        self,
        address: str,
        hostname: str,
        pid: int,
        *,
        job_id: str | None = None,
        token: str | None = None,
        connection: int = 1,
    ) -> None:
        self.sock = connect(address)
        self.sent_lines = 0
        self.sock.sendall(
            encode_frame(
                hello_line(hostname, pid, job_id=job_id, token=token, connection=connection)
            )
        )

    def send(self, lines: bytes) -> None:
        """Whole lines (each ending in a newline), split into frames at line ends."""
        for payload in frames_of(lines):
            self.sock.sendall(encode_frame(payload))
            self.sent_lines += payload.count(b"\n")

    def close(self) -> None:
        self.sock.close()


def frames_of(lines: bytes, limit: int = MAX_PAYLOAD) -> Iterator[bytes]:
    """Payloads of at most `limit` bytes, each ending at a line end."""
    start = 0
    while start < len(lines):
        end = min(len(lines), start + limit)
        if end < len(lines):
            cut = lines.rfind(b"\n", start, end) + 1
            if cut <= start:
                raise ValueError(f"a line longer than {limit} bytes cannot be sent")
            end = cut
        yield lines[start:end]
        start = end


@dataclass(frozen=True)
class ProcessFiles:
    host: str
    pid: int
    ops: Path
    state: Path | None

    def lines(self) -> list[tuple[int, bytes]]:
        """(time written in ns, line) of both files, merged in writing order. Each file
        keeps its own order (a line's time is at least its predecessor's): a stream
        carries a file's lines in the order they were written."""
        out: list[tuple[int, bytes]] = []
        for path, pattern, scale in ((self.ops, _DUMP_US, 1000), (self.state, _TS_NS, 1)):
            if path is None or not path.exists():
                continue
            last = 0
            for line in path.read_bytes().splitlines(keepends=True):
                if not line.endswith(b"\n"):
                    continue  # a line the writer never finished
                m = pattern.search(line)
                last = max(last, int(m.group(1)) * scale if m else 0)
                out.append((last, line))
        out.sort(key=lambda x: x[0])  # stable: ties keep file order
        return out

    def job_id(self) -> str | None:
        for path in (self.state, self.ops):
            if path is not None and path.exists():
                with path.open("rb") as f:
                    m = _JOB.search(f.read(1 << 16))
                if m:
                    return m.group(1).decode()
        return None


def process_files(directory: Path) -> list[ProcessFiles]:
    out = []
    for ops in sorted(Path(directory).glob("*.log")):
        m = _NAME.match(ops.name)
        if m:
            state = ops.with_name(ops.name[: -len(".log")] + ".rwstate.jsonl")
            out.append(ProcessFiles(m["host"], int(m["pid"]), ops, state))
    return out


def replay(
    directory: Path,
    address: str,
    *,
    speed: float | None = None,
    token: str | None = None,
    batch_ns: int = 20_000_000,
    on_frame: Callable[[ProcessFiles, list[bytes], float], None] | None = None,
) -> int:
    """Send the record files under `directory` to a monitor (see module doc); returns
    the lines sent. speed None: as fast as possible; 1.0: the recorded pace. Lines
    go out in batches of `batch_ns` of record time, as the plugin's drain does."""
    procs = process_files(directory)
    senders = {
        p: StreamSender(address, p.host, p.pid, job_id=p.job_id(), token=token) for p in procs
    }
    timeline = sorted(
        ((ts, i, line) for i, p in enumerate(procs) for ts, line in p.lines()),
        key=lambda x: (x[0], x[1]),
    )
    sent = 0
    try:
        t0_rec = next((ts for ts, _, _ in timeline if ts), 0)
        t0_wall = time.monotonic()
        k = 0
        while k < len(timeline):
            end = max(timeline[k][0], t0_rec) + batch_ns
            group: dict[int, list[bytes]] = {}
            while k < len(timeline) and timeline[k][0] < end:
                group.setdefault(timeline[k][1], []).append(timeline[k][2])
                k += 1
            if speed:
                delay = (end - t0_rec) / 1e9 / speed - (time.monotonic() - t0_wall)
                if delay > 0:
                    time.sleep(delay)
            for i, lines in group.items():
                senders[procs[i]].send(b"".join(lines))
                sent += len(lines)
                if on_frame is not None:
                    on_frame(procs[i], lines, time.time())
    finally:
        for s in senders.values():
            s.close()
    return sent
