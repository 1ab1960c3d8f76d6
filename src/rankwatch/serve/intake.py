"""The bounded hand-off between the transports (sockets, watched files) and the
processing thread.

Transports put whole lines, already split into op and state lines, tagged with
their `Source`; the processing thread takes them in order, a bounded number of
records at a time. Memory is bounded by `limit_bytes`: when the processing falls
behind, op lines are dropped and counted (the plugin's files keep them), while
state lines, which are few and carry the progress that hang detection reads, are
kept up to a reserve above the limit. Op lines that waited more than `max_lag_s`
are shed too when taken, so under overload the delay in front of progress
records (hang detection) stays bounded, not just the memory. Connection events
travel in the same queue so a close is seen after the connection's last lines.

State lines are also copied into a small second queue, the fast lane, that the
processing thread empties first on every tick: hang detection reads progress
records from it without waiting behind a backlog of op lines (the main queue
still carries them, in order, to every detector).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from rankwatch.serve.protocol import Hello, Lines

DEFAULT_LIMIT_BYTES = 128 * 1024 * 1024
STATE_RESERVE_BYTES = 32 * 1024 * 1024
MAX_LAG_S = 3.0  # op lines that waited longer are shed when taken
FAST_BYTES = 16 * 1024 * 1024  # copies of state lines for the hang fast lane


@dataclass(frozen=True)
class Source:
    """Where lines come from: one stream connection, or one watched file."""

    key: str  # unique while the monitor runs
    name: str  # how messages name it
    transport: str  # unix, tcp, watch, or a relay's name
    hello: Hello | None = None

    @property
    def proc(self) -> tuple[str, int] | None:
        return None if self.hello is None else (self.hello.hostname, self.hello.pid)


@dataclass
class Chunk:
    source: Source
    lines: Lines
    queued: float = 0.0  # time.monotonic() when it was put

    @property
    def size(self) -> int:
        return len(self.lines.ops) + len(self.lines.state)


@dataclass(frozen=True)
class Event:
    """A source opened or closed (streams only; files never close)."""

    source: Source
    kind: str  # open, close


@dataclass
class IntakeCounters:
    received: dict[str, int] = field(default_factory=lambda: {"op": 0, "state": 0})
    dropped: dict[str, int] = field(default_factory=dict)  # records, by reason
    rejected_lines: dict[str, int] = field(default_factory=dict)  # by reason


class Intake:
    """A thread-safe FIFO of chunks and events, bounded in bytes (see module doc)."""

    def __init__(
        self,
        limit_bytes: int = DEFAULT_LIMIT_BYTES,
        state_reserve: int = STATE_RESERVE_BYTES,
        max_lag_s: float = MAX_LAG_S,
    ) -> None:
        self.limit = limit_bytes
        self.max_lag_s = max_lag_s
        self.reserve = state_reserve
        self.counters = IntakeCounters()
        self._items: deque[Chunk | Event] = deque()
        self._bytes = 0
        self._fast: deque[Chunk] = deque()
        self._fast_bytes = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def room(self) -> int:
        """Bytes that can be put without dropping anything."""
        return max(0, self.limit - self._bytes)

    def put(self, source: Source, lines: Lines) -> None:
        """Queue a payload's lines, dropping op lines (counted) when full."""
        c = self.counters
        with self._lock:  # counters too: a relay may put from its own thread
            c.received["op"] += lines.n_ops
            c.received["state"] += lines.n_state
            if lines.unterminated:
                _add(c.rejected_lines, "unterminated", lines.unterminated)
            if self._bytes + len(lines.ops) + len(lines.state) > self.limit and lines.n_ops:
                _add(c.dropped, "monitor_overloaded", lines.n_ops)
                lines = Lines(state=lines.state, n_state=lines.n_state)
            if self._bytes + len(lines.state) > self.limit + self.reserve and lines.n_state:
                _add(c.dropped, "monitor_overloaded", lines.n_state)
                return
            if not lines.records:
                return
            chunk = Chunk(source, lines, time.monotonic())
            self._items.append(chunk)
            self._bytes += chunk.size
            if lines.n_state and self._fast_bytes + len(lines.state) <= FAST_BYTES:
                state = Lines(state=lines.state, n_state=lines.n_state)
                self._fast.append(Chunk(source, state, chunk.queued))
                self._fast_bytes += len(lines.state)
        self._ready.set()

    def count_dropped(self, reason: str, n: int) -> None:
        """Records lost before they reached this intake (e.g. shed by an agent)."""
        with self._lock:  # the processing thread reads these counters
            _add(self.counters.dropped, reason, n)

    def take_fast(self) -> list[Chunk]:
        """Every state line queued since the last call (copies; see module doc)."""
        with self._lock:
            out, self._fast, self._fast_bytes = list(self._fast), deque(), 0
        return out

    def event(self, source: Source, kind: str) -> None:
        with self._lock:
            self._items.append(Event(source, kind))
        self._ready.set()

    def lag(self) -> float:
        """Seconds the oldest queued chunk has waited."""
        with self._lock:
            for item in self._items:
                if isinstance(item, Chunk):
                    return time.monotonic() - item.queued
        return 0.0

    def take(self, max_records: int) -> list[Chunk | Event]:
        """The oldest items, up to about max_records records (at least one item)."""
        out: list[Chunk | Event] = []
        records = 0
        old = time.monotonic() - self.max_lag_s
        with self._lock:
            while self._items and (records < max_records or not out):
                item = self._items.popleft()
                if isinstance(item, Chunk):
                    self._bytes -= item.size
                    if item.queued < old and item.lines.n_ops:  # overloaded: keep the state
                        _add(self.counters.dropped, "monitor_overloaded", item.lines.n_ops)
                        item = Chunk(
                            item.source,
                            Lines(state=item.lines.state, n_state=item.lines.n_state),
                            item.queued,
                        )
                    records += item.lines.records
                out.append(item)
            if not self._items:
                self._ready.clear()
        return out

    def wait(self, timeout: float) -> bool:
        """Until something is queued or timeout seconds pass."""
        return self._ready.wait(timeout)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n
