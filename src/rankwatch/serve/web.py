"""The monitor's HTTP side: `/metrics` for Prometheus, `/` the live page, and
`/api/state` (JSON) that the page polls. A small HTTP/1.1 server on asyncio
(GET only, one request per connection), so serving needs nothing beyond the
standard library and never waits on the processing thread: every response is
made from the latest snapshot.

When the monitor listens beyond loopback, every request needs the token, as
`Authorization: Bearer <token>` (Prometheus: `authorization: {credentials: ...}`)
or `?token=<token>` (the page passes it on to its own requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rankwatch.errors import ConfigError
from rankwatch.serve.metrics import CONTENT_TYPE, render

REQUEST_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 16 * 1024
MAX_CLIENTS = 64
JSON_TYPE = "application/json"
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 503: "Service Unavailable"}  # fmt: skip


def page() -> bytes:
    return resources.files("rankwatch.serve").joinpath("static/index.html").read_bytes()


class WebServer:
    """See module doc."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        token: str | None = None,
        max_rank_series: int = 256,
    ) -> None:
        self.snapshot = snapshot
        self.token = token
        self.max_rank_series = max_rank_series
        self.requests = 0
        self._page = page()
        self._server: asyncio.AbstractServer | None = None
        self._clients = 0

    async def listen(self, host: str, port: int) -> int:
        try:
            self._server = await asyncio.start_server(self._handle, host, port)
        except OSError as exc:
            raise ConfigError(f"cannot serve HTTP on {host}:{port}: {exc.strerror}") from exc
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients += 1
        try:
            if self._clients > MAX_CLIENTS:
                status, ctype, body = 503, "text/plain", b"too many clients\n"
            else:
                head = await asyncio.wait_for(_read_head(reader), REQUEST_TIMEOUT_S)
                status, ctype, body = self._respond(head)
            await _send(writer, status, ctype, body)
        except (asyncio.TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients -= 1
            writer.close()

    def _respond(self, head: bytes) -> tuple[int, str, bytes]:
        try:
            method, target, headers = _parse(head)
        except ValueError:
            return 400, "text/plain", b"bad request\n"
        if method != "GET":
            return 405, "text/plain", b"only GET\n"
        url = urlsplit(target)
        query = parse_qs(url.query)
        if not self._authorized(headers, query):
            return 401, "text/plain", b"token required\n"
        self.requests += 1
        return self._route(url.path, query)

    def _route(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        if path == "/metrics":
            text = render(self.snapshot(), self.max_rank_series)
            return 200, CONTENT_TYPE, text.encode()
        if path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", self._page
        if path == "/api/state":
            snap = self.snapshot()
            job = query.get("job", [None])[0]
            if job is not None:
                snap = {**snap, "jobs": [j for j in snap["jobs"] if j["key"] == job]}
            return 200, JSON_TYPE, json.dumps(snap, default=str).encode()
        if path == "/api/findings":
            snap = self.snapshot()
            out = [{"job": j["key"], **f} for j in snap["jobs"] for f in j["findings"]]
            return 200, JSON_TYPE, json.dumps(out, default=str).encode()
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        return 404, "text/plain", b"not found\n"

    def _authorized(self, headers: dict[str, str], query: dict[str, list[str]]) -> bool:
        if self.token is None:
            return True
        given = headers.get("authorization", "")
        given = given[len("Bearer ") :] if given.startswith("Bearer ") else ""
        given = given or query.get("token", [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        chunk = await reader.read(4096)
        if not chunk:
            raise ConnectionError("closed before the request ended")
        head += chunk
        if len(head) > MAX_HEADER_BYTES:
            raise ValueError("request head too long")
    return head


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    text = head.decode("latin-1")
    lines = text.replace("\r\n", "\n").split("\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("bad request line")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return parts[0], parts[1], headers


async def _send(writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes) -> None:
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
