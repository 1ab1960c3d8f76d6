"""Stream listeners: Unix and TCP sockets speaking docs/stream-protocol.md.

Each connection's first frame must be a hello (within HELLO_TIMEOUT_S); after it,
frames carry lines into the Intake. A connection that breaks the protocol (a
declared length above the limit, a bad or newer hello, a wrong token, a frame
cut short) is closed and counted by reason; every other connection keeps being
served. Nothing is ever written back: the protocol is one-way.

Addresses: `unix:/path/to/socket` or `tcp://host:port`. A TCP listener on
anything but loopback needs a token (the monitor refuses to start without one);
when a token is set it is required on every listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import itertools
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from rankwatch.errors import ConfigError
from rankwatch.serve.intake import Intake, Source
from rankwatch.serve.protocol import (
    HEADER,
    Hello,
    ProtocolError,
    frame_length,
    parse_hello,
    split_lines,
)

HELLO_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 4096
READ_LIMIT = 1 << 22  # StreamReader buffer (bytes), the frame limit
REJECT_MESSAGE_EVERY_S = 10.0
BACKLOG = 1024  # every rank of a big node may (re)connect at once


@dataclass(frozen=True)
class Address:
    transport: str  # unix or tcp
    path: str | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.transport == "unix" else f"tcp://{_hostport(self)}"

    @property
    def loopback(self) -> bool:
        return self.transport == "unix" or is_loopback(self.host or "")


def _hostport(a: Address) -> str:
    host = a.host or ""
    return f"[{host}]:{a.port}" if ":" in host else f"{host}:{a.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_address(text: str, what: str = "--listen") -> Address:
    """`unix:/path` or `tcp://host:port` (port 0: any free port)."""
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise ConfigError(f"{text!r}: expected unix:/path/to/socket", field=what)
        return Address("unix", path=os.path.abspath(path))
    if text.startswith("tcp://"):
        rest = text[len("tcp://") :]
        host, sep, port = rest.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ConfigError(f"{text!r}: expected tcp://host:port", field=what)
        return Address("tcp", host=host.strip("[]"), port=int(port))
    raise ConfigError(f"{text!r}: expected unix:/path or tcp://host:port", field=what)


@dataclass
class ListenerCounters:
    frames: int = 0
    bytes: int = 0
    connections: int = 0  # accepted, ever
    open: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # frames/connections, by reason


class StreamServer:
    """Every listener of one monitor, feeding one Intake."""

    def __init__(self, intake: Intake, token: str | None, log) -> None:  # noqa: ANN001
        self.intake = intake
        self.token = token
        self.log = log
        self.counters = ListenerCounters()
        self.bound: list[Address] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._said: dict[str, float] = {}

    async def listen(self, address: Address) -> Address:
        """Start one listener; returns the address actually bound (tcp port 0)."""
        if not address.loopback and not self.token:
            raise ConfigError(
                f"{address} is not loopback: set a shared token (--token or "
                "RANKWATCH_COLLECTOR_TOKEN) that the plugins and agents send",
                field="--listen",
            )
        if address.transport == "unix":
            server = await self._listen_unix(address)
            bound = address
        else:
            try:
                server = await asyncio.start_server(
                    self._serve, address.host, address.port, limit=READ_LIMIT, backlog=BACKLOG
                )
            except OSError as exc:
                raise ConfigError(f"cannot listen on {address}: {exc.strerror}") from exc
            port = server.sockets[0].getsockname()[1]
            bound = Address("tcp", host=address.host, port=port)
        self._servers.append(server)
        self.bound.append(bound)
        return bound

    async def _listen_unix(self, address: Address) -> asyncio.AbstractServer:
        path = Path(address.path or "")
        if path.exists() or path.is_symlink():
            if not _stale_socket(path):
                raise ConfigError(f"{path}: exists and is not a stale socket", field="--listen")
            path.unlink()
        try:
            server = await asyncio.start_unix_server(
                self._serve, str(path), limit=READ_LIMIT, backlog=BACKLOG
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen on {address}: {exc.strerror}") from exc
        os.chmod(path, 0o600)  # only the job's own user may send
        return server

    async def close(self) -> None:
        for s in self._servers:
            s.close()
        for task in list(self._tasks):
            task.cancel()
        for s in self._servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()
        for a in self.bound:
            if a.transport == "unix" and a.path:
                with contextlib.suppress(OSError):
                    os.unlink(a.path)

    # ------------------------------------------------------------------ connections
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        c = self.counters
        c.connections += 1
        c.open += 1
        source: Source | None = None
        try:
            if c.open > MAX_CONNECTIONS:
                raise ProtocolError("too_many_connections", "too many open connections")
            hello = await asyncio.wait_for(self._hello(reader), HELLO_TIMEOUT_S)
            source = Source(f"conn{next(self._ids)}", hello.source, _transport(writer), hello)
            self.intake.event(source, "open")
            await self._frames(reader, source)
        except ProtocolError as exc:
            self._reject(exc, source, writer)
        except asyncio.TimeoutError:
            self._reject(ProtocolError("hello_timeout", "no hello in time"), source, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            c.open -= 1
            if source is not None:
                self.intake.event(source, "close")
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _hello(self, reader: asyncio.StreamReader) -> Hello:
        payload = await self._frame(reader, first=True)
        hello = parse_hello(payload)
        if self.token is not None and not hmac.compare_digest(
            (hello.token or "").encode(), self.token.encode()
        ):
            raise ProtocolError("bad_token", f"{hello.source}: token missing or wrong")
        return hello

    async def _frames(self, reader: asyncio.StreamReader, source: Source) -> None:
        while True:
            payload = await self._frame(reader)
            if payload is None:
                return
            if payload:
                self.intake.put(source, split_lines(payload))

    async def _frame(self, reader: asyncio.StreamReader, first: bool = False) -> bytes | None:
        """One payload; None at a clean end of stream (between frames)."""
        try:
            header = await reader.readexactly(HEADER.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial or first:
                raise ProtocolError("truncated", "connection closed inside a frame") from None
            return None
        n = frame_length(header)
        try:
            payload = await reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise ProtocolError("truncated", "connection closed inside a frame") from None
        self.counters.frames += 1
        self.counters.bytes += HEADER.size + n
        return payload

    def _reject(self, exc: ProtocolError, source: Source | None, writer) -> None:  # noqa: ANN001
        r = self.counters.rejected
        r[exc.reason] = r.get(exc.reason, 0) + 1
        now = time.monotonic()
        if now - self._said.get(exc.reason, -1e9) < REJECT_MESSAGE_EVERY_S:
            return  # a flood of bad connections must not flood the log too
        self._said[exc.reason] = now
        who = source.name if source is not None else _peer(writer)
        total = f" ({r[exc.reason]} so far)" if r[exc.reason] > 1 else ""
        print(f"rankwatch monitor: closed {who}: {exc.message}{total}", file=self.log)


def _transport(writer: asyncio.StreamWriter) -> str:
    sock = writer.get_extra_info("socket")
    return "unix" if sock is not None and sock.family == socket.AF_UNIX else "tcp"


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"connection from {peer}" if peer else "a connection on a Unix socket"


def _stale_socket(path: Path) -> bool:
    """A socket file nobody listens on (left by a monitor that was killed)."""
    if not path.is_socket():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return True
    finally:
        probe.close()
    raise ConfigError(f"{path}: another monitor is listening there", field="--listen")
