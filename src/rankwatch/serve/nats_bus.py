"""What `rankwatch agent` and `rankwatch monitor --nats` agree on (docs/scale.md):
subjects, the communicator bucket of a record, the sampling rule, the batch wire
format, and connecting to NATS.

Subjects (JOB is the job id with anything but letters, digits, `-` and `_` as `_`):

  rankwatch.JOB.ops.B       op records, and the comm/progress/clock state records,
                            of the communicators in bucket B, plus the stats records
                            of the processes in them; exactly one worker owns B
  rankwatch.JOB.progress    per-process progress heartbeats (every worker)
  rankwatch.JOB.summary     per-window per-(comm, rank, func) op aggregates
  rankwatch._workers.GROUP  worker membership heartbeats (who owns which buckets)

A batch (one ops message) is zlib-compressed bytes: one JSON header line naming
its parts (which process, how many op and state bytes and lines, whether the
process's stream opened or closed), then each part's op lines and state lines,
byte-identical to the plugin's lines. So a worker feeds the same decoded lines
to the same live state as a socket listener does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rankwatch.errors import ConfigError

WIRE_VERSION = 1
DEFAULT_BUCKETS = 64
DEFAULT_NATS = "nats://127.0.0.1:4222"
DEFAULT_GROUP = "rankwatch"
MAX_MESSAGE = 768 * 1024  # compressed; below the server's default max_payload (1 MiB)
ZLIB_LEVEL = 1  # JSON lines of one communicator compress ~10x even at level 1

_COMM_OP = re.compile(rb'^\{"header":\{"id":"([^"]*)"')
_COMM_STATE = re.compile(rb'"comm_id":"([^"]*)"')
_SEQ = re.compile(rb'"seq":(-?\d+)')
_KIND = re.compile(rb'"kind":"([a-z_]+)"')
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def subject_token(text: str | None) -> str:
    """A job id as one NATS subject token (no dots, spaces or wildcards)."""
    return _UNSAFE.sub("_", text or "unknown")[:128] or "unknown"


def ops_subject(job: str | None, bucket: int) -> str:
    return f"rankwatch.{subject_token(job)}.ops.{bucket}"


def progress_subject(job: str | None) -> str:
    return f"rankwatch.{subject_token(job)}.progress"


def summary_subject(job: str | None) -> str:
    return f"rankwatch.{subject_token(job)}.summary"


def workers_subject(group: str) -> str:
    return f"rankwatch._workers.{subject_token(group)}"


def _hash64(*parts: bytes) -> int:
    # blake2b, not hash(): every agent and worker, on any host and Python, must agree
    return int.from_bytes(hashlib.blake2b(b"\0".join(parts), digest_size=8).digest(), "big")


def bucket_of(comm_id: bytes, buckets: int) -> int:
    """The bucket of a communicator: every rank's records of it meet in one worker."""
    return _hash64(b"comm", comm_id) % buckets


def sampled(comm_id: bytes, seq: int, every: int) -> bool:
    """Whether op (comm, seq) is forwarded when 1 in `every` is: a hash of (comm, seq),
    so all ranks keep the same collectives and each kept one is complete."""
    return every <= 1 or _hash64(b"seq", comm_id, str(seq).encode()) % every == 0


def owner(bucket: int, members: list[str]) -> str:
    """Rendezvous hashing: the member that owns a bucket. Workers that see the same
    members agree without talking, and a member leaving moves only its buckets."""
    return max(members, key=lambda m: (_hash64(b"own", m.encode(), str(bucket).encode()), m))


def op_comm(line: bytes) -> bytes | None:
    m = _COMM_OP.match(line)
    return m.group(1) if m else None


def state_comm(line: bytes) -> bytes | None:
    m = _COMM_STATE.search(line)
    return m.group(1) if m else None


def op_seq(line: bytes) -> int | None:
    m = _SEQ.search(line)
    return int(m.group(1)) if m else None


def state_kind(line: bytes) -> str | None:
    m = _KIND.search(line)
    return m.group(1).decode() if m else None


# ---------------------------------------------------------------------- batches
@dataclass
class Part:
    """One process's lines in a batch (see module doc)."""

    host: str
    pid: int
    job: str | None
    connection: int
    dropped: int  # the plugin's stream drops, from its hello
    ops: list[bytes] = field(default_factory=list)  # lines with their newline
    state: list[bytes] = field(default_factory=list)
    opened: bool = False
    closed: bool = False

    @property
    def records(self) -> int:
        return len(self.ops) + len(self.state)

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.ops)) + sum(map(len, self.state))


def encode_batch(agent: str, number: int, parts: list[Part]) -> tuple[bytes, int]:
    """(compressed message, raw bytes) of parts."""
    heads, bodies = [], []
    for p in parts:
        ops, state = b"".join(p.ops), b"".join(p.state)
        heads.append({"host": p.host, "pid": p.pid, "job": p.job, "conn": p.connection,
                      "dropped": p.dropped, "ops": len(ops), "state": len(state),
                      "n_ops": len(p.ops), "n_state": len(p.state),
                      "open": p.opened, "close": p.closed})  # fmt: skip
        bodies += [ops, state]
    header = {"v": WIRE_VERSION, "agent": agent, "n": number, "parts": heads}
    raw = json.dumps(header, separators=(",", ":")).encode() + b"\n" + b"".join(bodies)
    return zlib.compress(raw, ZLIB_LEVEL), len(raw)


@dataclass(frozen=True)
class DecodedPart:
    head: dict[str, Any]
    ops: bytes
    state: bytes


def decode_batch(data: bytes) -> tuple[dict[str, Any], list[DecodedPart]]:
    """(header, parts) of a message; ValueError when it is not a batch this reads."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise ValueError(f"not a compressed batch: {exc}") from None
    first, _, body = raw.partition(b"\n")
    header = json.loads(first)
    if not isinstance(header, dict) or header.get("v") != WIRE_VERSION:
        raise ValueError(f"batch wire version {header.get('v')!r}, this reads {WIRE_VERSION}")
    parts, at = [], 0
    for head in header["parts"]:
        ops = body[at : at + head["ops"]]
        at += head["ops"]
        state = body[at : at + head["state"]]
        at += head["state"]
        parts.append(DecodedPart(head, ops, state))
    if at != len(body):
        raise ValueError("batch body does not match its header")
    return header, parts


# ---------------------------------------------------------------------- connecting
@dataclass
class BusCounters:
    disconnects: int = 0
    reconnects: int = 0
    errors: int = 0
    slow_consumer: int = 0
    last_error: str | None = None


async def connect(
    url: str,
    name: str,
    counters: BusCounters,
    on_reconnect: Callable[[], Awaitable[None]] | None = None,
    pending_bytes: int = 16 * 1024 * 1024,
) -> Any:
    """A NATS connection that reconnects forever (a server restart costs only what
    did not fit in `pending_bytes` meanwhile, counted by the caller)."""
    try:
        import nats
        from nats.errors import SlowConsumerError
    except ImportError as exc:
        raise ConfigError(
            "NATS needs the nats-py package: pip install 'rankwatch[nats]'", field="--nats"
        ) from exc

    async def disconnected() -> None:
        counters.disconnects += 1

    async def reconnected() -> None:
        counters.reconnects += 1
        if on_reconnect is not None:
            await on_reconnect()

    async def error(exc: Exception) -> None:
        counters.errors += 1
        counters.last_error = repr(exc)[:200]
        if isinstance(exc, SlowConsumerError):
            counters.slow_consumer += 1

    return await nats.connect(
        servers=[url], name=name, allow_reconnect=True, max_reconnect_attempts=-1,
        reconnect_time_wait=0.25, connect_timeout=2, pending_size=pending_bytes,
        disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error,
    )  # fmt: skip


async def connect_retrying(url: str, name: str, counters: BusCounters, stop: asyncio.Event) -> Any:
    """connect(), retried every second until it works or `stop` is set (None then):
    an agent must start, and keep its ranks' streams drained, before the server is up."""
    while not stop.is_set():
        try:
            return await connect(url, name, counters)
        except ConfigError:
            raise
        except Exception as exc:  # server not there yet: say so once per try, retry
            counters.errors += 1
            counters.last_error = repr(exc)[:200]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    return None
