"""The stream protocol (docs/stream-protocol.md): frames, the hello, and lines.

A frame is a 4-byte big-endian payload length and the payload: complete JSON
lines, each byte-identical to a line of the plugin's files. The first frame of a
connection is the hello. Everything here is pure (no sockets), so the listener,
the file watcher, tests and a future relay share one reading of the contract.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = 1
MAX_PAYLOAD = 4 * 1024 * 1024  # the largest payload a receiver accepts (bytes)
HEADER = struct.Struct(">I")
# State records are flat objects whose first key is `schema` (record-format.md);
# op records start with their Inspector `header` object. Splitting on this prefix
# avoids decoding every line in Python; a line that is neither still goes to the
# state reader, which counts it as bad.
OP_PREFIX = b'{"header"'


class ProtocolError(Exception):
    """A connection broke the protocol; `reason` is the metric label, `message` says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Hello:
    """The first line of a connection: who is sending and what it dropped so far."""

    protocol: int
    schema: int
    hostname: str
    pid: int
    job_id: str | None
    plugin_version: str
    ops_file: str
    state_file: str
    token: str | None
    connection: int
    stream_dropped_records: int

    @property
    def source(self) -> str:
        """How problems name this sender: its op-record file's stem and connection."""
        return f"{self.hostname}-pid{self.pid} (stream connection {self.connection})"


_HELLO_TYPES: dict[str, tuple[type, ...]] = {
    "protocol": (int,),
    "schema": (int,),
    "hostname": (str,),
    "pid": (int,),
    "plugin_version": (str,),
    "ops_file": (str,),
    "state_file": (str,),
    "connection": (int,),
    "stream_dropped_records": (int,),
}
_HELLO_OPTIONAL: dict[str, tuple[type, ...]] = {"job_id": (str,), "token": (str,)}


def encode_frame(payload: bytes) -> bytes:
    """Length prefix + payload (raises ValueError above MAX_PAYLOAD)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return HEADER.pack(len(payload)) + payload


def frame_length(header: bytes) -> int:
    """The declared payload length; ProtocolError('oversized') above the limit."""
    (n,) = HEADER.unpack(header)
    if n > MAX_PAYLOAD:
        raise ProtocolError(
            "oversized", f"frame declares {n:,} bytes, more than the {MAX_PAYLOAD:,} allowed"
        )
    return n


def parse_hello(payload: bytes) -> Hello:
    """The hello of a connection's first frame; ProtocolError naming what is wrong."""
    if payload.count(b"\n") != 1 or not payload.endswith(b"\n"):
        raise ProtocolError("bad_hello", "the first frame must hold exactly one line, the hello")
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise ProtocolError("bad_hello", f"hello is not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") != "hello":
        raise ProtocolError("bad_hello", 'the first line is not a hello ({"kind": "hello", ...})')
    _check_types(obj)
    if obj["protocol"] > PROTOCOL_VERSION:
        raise ProtocolError(
            "newer_protocol",
            f"hello speaks stream protocol {obj['protocol']}, newer than the newest this "
            f"monitor reads (protocol {PROTOCOL_VERSION}); upgrade rankwatch on the collector",
        )
    fields = {k: obj[k] for k in _HELLO_TYPES}
    fields.update({k: obj.get(k) for k in _HELLO_OPTIONAL})
    return Hello(**fields)


def _check_types(obj: dict[str, Any]) -> None:
    for name, types in _HELLO_TYPES.items():
        value = obj.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            raise ProtocolError("bad_hello", f"hello field {name!r}: missing or wrongly typed")
    for name, types in _HELLO_OPTIONAL.items():
        value = obj.get(name)
        if value is not None and not isinstance(value, types):
            raise ProtocolError("bad_hello", f"hello field {name!r}: wrongly typed")


def hello_line(
    hostname: str,
    pid: int,
    *,
    job_id: str | None = None,
    token: str | None = None,
    connection: int = 1,
    dropped: int = 0,
    plugin_version: str = "",
    protocol: int = PROTOCOL_VERSION,
    schema: int = 1,
) -> bytes:
    """A hello line as the plugin writes it (for senders and tests)."""
    obj = {
        "kind": "hello",
        "protocol": protocol,
        "schema": schema,
        "hostname": hostname,
        "pid": pid,
        "job_id": job_id,
        "plugin_version": plugin_version,
        "ops_file": f"{hostname}-pid{pid}.log",
        "state_file": f"{hostname}-pid{pid}.rwstate.jsonl",
        "token": token,
        "connection": connection,
        "stream_dropped_records": dropped,
    }
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


@dataclass
class Lines:
    """A payload's lines, split into op and state lines (newline-terminated, joined)."""

    ops: bytes = b""
    state: bytes = b""
    n_ops: int = 0
    n_state: int = 0
    unterminated: int = 0  # a trailing piece without its newline (a broken sender)

    @property
    def records(self) -> int:
        return self.n_ops + self.n_state


def split_lines(payload: bytes) -> Lines:
    """Op lines and state lines of a payload. Empty lines are skipped; a last piece
    without a newline is counted, not kept (a line is only whole with its newline)."""
    parts = payload.split(b"\n")
    tail = parts.pop()  # b"" when the payload ends with a newline
    ops = [p for p in parts if p.startswith(OP_PREFIX)]
    state = [p for p in parts if p and not p.startswith(OP_PREFIX)]
    return Lines(
        ops=_join(ops),
        state=_join(state),
        n_ops=len(ops),
        n_state=len(state),
        unterminated=1 if tail.strip() else 0,
    )


def _join(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n" if lines else b""
