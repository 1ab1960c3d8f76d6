"""`rankwatch monitor --nats URL`: a monitor worker fed from NATS (docs/scale.md).

Workers of one group (`--queue-group`) announce themselves every HEARTBEAT_S on
the group's membership subject; each keeps the members heard from in the last
MEMBER_TTL_S and takes the communicator buckets that rendezvous hashing gives it
(nats_bus.owner). Every worker computes the same split from the same members, so
each communicator's records meet in one worker and its detectors see all its
ranks. The bucket subscriptions also join the NATS queue group, so while owners
change hands a batch still goes to one worker, never two.

A batch's parts become the same Source/lines/open/close items a socket listener
puts in the Intake, so the monitor's LiveState, detectors, page, metrics and
alerts run unchanged. Records an agent had to drop reach the Intake's drop
counters (`upstream_dropped`), so the jobs know their view has gaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from rankwatch.errors import ConfigError
from rankwatch.serve.intake import Intake, Source
from rankwatch.serve.nats_bus import (
    DEFAULT_BUCKETS,
    DEFAULT_GROUP,
    BusCounters,
    DecodedPart,
    connect,
    decode_batch,
    owner,
    workers_subject,
)
from rankwatch.serve.protocol import PROTOCOL_VERSION, Hello, Lines

HEARTBEAT_S = 0.5
MEMBER_TTL_S = 2.5  # a member silent this long has left; its buckets move
SETTLE_S = 1.5  # listen to the group this long before taking buckets


@dataclass
class FeedCounters:
    messages: int = 0
    bytes: int = 0
    records: int = 0
    bad_messages: int = 0
    heartbeats: int = 0
    summaries: int = 0
    summary_ops: int = 0  # op records the agents' summaries count
    subjects: set[str] = field(default_factory=set)  # bucket subjects that came here


class NatsFeed:
    """Subscriptions of one worker, feeding one Intake (see module doc); a monitor.Feed."""

    section = "nats"

    def __init__(
        self, url: str, group: str, intake: Intake, buckets: int = DEFAULT_BUCKETS,
        name: str | None = None,
    ) -> None:  # fmt: skip
        self.url, self.group, self.intake, self.buckets = url, group, intake, buckets
        self.name = name or f"worker-{uuid.uuid4().hex[:12]}"
        self.bus = BusCounters()
        self.counters = FeedCounters()
        self.members: dict[str, float] = {}
        self.owned: dict[int, Any] = {}  # bucket -> subscription
        self.liveness: dict[str, dict[str, Any]] = {}  # job -> process -> heartbeat
        self.nc: Any = None
        self._sources: dict[tuple, tuple[Source, set[str]]] = {}
        self._lost: dict[tuple, int] = {}
        self._started = time.monotonic()

    async def start(self) -> None:
        try:
            self.nc = await connect(self.url, self.name, self.bus, self._rejoin)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"cannot reach NATS at {self.url}: {exc!r}", field="--nats") from exc
        await self.nc.subscribe(workers_subject(self.group), cb=self._on_member)
        await self.nc.subscribe("rankwatch.*.progress", cb=self._on_heartbeat)
        await self.nc.subscribe("rankwatch.*.summary", queue=self.group, cb=self._on_summary)

    async def run(self) -> None:
        """Membership heartbeats and bucket ownership, until cancelled."""
        while True:
            await self._announce()
            await self._rebalance()
            await asyncio.sleep(HEARTBEAT_S)

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    async def _rejoin(self) -> None:
        # a restarted server forgot the interest; the client resubscribes by itself,
        # and the next heartbeat re-announces this worker
        self.members = {}
        self._started = time.monotonic()

    # ------------------------------------------------------------------ membership
    async def _announce(self) -> None:
        body = {"name": self.name, "buckets": sorted(self.owned)}
        with contextlib.suppress(Exception):
            await self.nc.publish(workers_subject(self.group), json.dumps(body).encode())

    async def _on_member(self, msg: Any) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.members[str(json.loads(msg.data)["name"])] = time.monotonic()

    def live_members(self) -> list[str]:
        now = time.monotonic()
        self.members = {m: t for m, t in self.members.items() if now - t < MEMBER_TTL_S}
        return sorted(set(self.members) | {self.name})

    async def _rebalance(self) -> None:
        if time.monotonic() - self._started < SETTLE_S:
            return
        members = self.live_members()
        want = {b for b in range(self.buckets) if owner(b, members) == self.name}
        for b in sorted(set(self.owned) - want):
            with contextlib.suppress(Exception):
                await self.owned.pop(b).unsubscribe()
        for b in sorted(want - set(self.owned)):
            self.owned[b] = await self.nc.subscribe(
                f"rankwatch.*.ops.{b}", queue=self.group, cb=self._on_batch,
                pending_msgs_limit=65_536, pending_bytes_limit=512 * 1024 * 1024,
            )  # fmt: skip

    # ------------------------------------------------------------------ records
    async def _on_batch(self, msg: Any) -> None:
        c = self.counters
        try:
            header, parts = decode_batch(msg.data)
        except (ValueError, KeyError, TypeError):
            c.bad_messages += 1
            return
        c.messages += 1
        c.bytes += len(msg.data)
        c.subjects.add(msg.subject)
        for part in parts:
            self._feed(str(header.get("agent")), msg.subject, part)

    def _feed(self, agent: str, subject: str, part: DecodedPart) -> None:
        h = part.head
        key = (agent, h["host"], h["pid"], h["conn"])
        known = self._sources.get(key)
        if known is None:
            known = self._sources[key] = (self._source(key, h), set())
        source, subjects = known
        if subject not in subjects:
            if not subjects:
                self.intake.event(source, "open")
            subjects.add(subject)
        self._note_lost(key, int(h.get("dropped", 0)) - source.hello.stream_dropped_records)
        lines = Lines(ops=part.ops, state=part.state, n_ops=h["n_ops"], n_state=h["n_state"])
        if lines.records:
            self.intake.put(source, lines)
            self.counters.records += lines.records
        if h.get("close"):
            subjects.discard(subject)
            if not subjects:  # the process's stream closed in every bucket it used
                self.intake.event(source, "close")
                del self._sources[key]

    def _note_lost(self, key: tuple, lost: int) -> None:
        """Records an agent dropped for this process (cumulative in each batch)."""
        new = lost - self._lost.get(key, 0)
        if new > 0:
            self._lost[key] = lost
            self.intake.count_dropped("upstream_dropped", new)

    @staticmethod
    def _source(key: tuple, h: dict[str, Any]) -> Source:
        agent, host, pid, conn = key
        stem = f"{host}-pid{pid}"
        hello = Hello(PROTOCOL_VERSION, 1, host, pid, h.get("job"), "", f"{stem}.log",
                      f"{stem}.rwstate.jsonl", None, conn, int(h.get("dropped", 0)))  # fmt: skip
        return Source(f"nats:{agent}:{host}:{pid}:{conn}", f"{hello.source} via {agent}",
                      "nats", hello)  # fmt: skip

    # ------------------------------------------------------------------ heartbeats
    async def _on_heartbeat(self, msg: Any) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(msg.data)
            procs = self.liveness.setdefault(str(body["job"]), {})
            for p in body["procs"]:
                procs[f"{p['host']}:{p['pid']}"] = {**p, "agent": body["agent"], "t": body["t"]}
            self.counters.heartbeats += 1

    async def _on_summary(self, msg: Any) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError, zlib.error):
            body = json.loads(zlib.decompress(msg.data))
            i = body["columns"].index("n")
            self.counters.summary_ops += sum(int(r[i]) for r in body["rows"])
            self.counters.summaries += 1

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "worker": self.name, "group": self.group, "members": self.live_members(),
            "buckets": sorted(self.owned), "subjects": sorted(c.subjects),
            "messages": c.messages, "bytes": c.bytes, "records": c.records,
            "bad_messages": c.bad_messages, "heartbeats": c.heartbeats,
            "summaries": c.summaries, "summary_ops": c.summary_ops,
            "liveness": {job: len(p) for job, p in self.liveness.items()},
            "disconnects": self.bus.disconnects, "reconnects": self.bus.reconnects,
            "slow_consumer": self.bus.slow_consumer,
        }  # fmt: skip


def nats_feed(url: str, group: str = DEFAULT_GROUP, buckets: int = DEFAULT_BUCKETS):
    """A maker of this worker's NatsFeed, for Monitor(cfg, feeds=[...])."""
    return lambda intake: NatsFeed(url, group, intake, buckets)
