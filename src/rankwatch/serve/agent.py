"""`rankwatch agent`: one per node. Takes the local ranks' plugin streams (the same
listener and protocol as the monitor), and publishes to NATS (docs/scale.md):

- each communicator's records to its bucket subject, so one worker sees all of a
  communicator's ranks (op records, optionally only the sampled sequence numbers
  that every rank samples alike; comm/progress/clock records always);
- per-process progress heartbeats, every window, to every worker;
- per-window per-(comm, process, func) op aggregates (counts, seq range, GPU time),
  computed before sampling, so totals stay exact whatever is sampled.

Nothing here decodes JSON on the op path: lines are routed by their communicator id
at a fixed place. Under overload the agent drops op records first (counted, per
process, and told to the workers so they know their view has gaps); state records,
heartbeats and summaries go on while NATS accepts anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rankwatch.serve.intake import Chunk, Event, Intake, Source
from rankwatch.serve.listener import StreamServer, parse_address
from rankwatch.serve.nats_bus import (
    DEFAULT_BUCKETS,
    DEFAULT_NATS,
    MAX_MESSAGE,
    BusCounters,
    Part,
    bucket_of,
    connect_retrying,
    encode_batch,
    op_comm,
    op_seq,
    ops_subject,
    progress_subject,
    sampled,
    state_comm,
    state_kind,
    summary_subject,
)

AGENT_INTAKE_BYTES = 64 * 1024 * 1024
_FUNC = re.compile(rb'"func":"([A-Za-z]+)"')
_EXEC = re.compile(rb'"exec_time_ns":(\d+)')
_TS = re.compile(rb'"ts_ns":(\d+)')
_EXIT = b'"reason":"exit"'


@dataclass
class AgentConfig:
    listen: list[str]
    nats: str = DEFAULT_NATS
    token: str | None = None
    name: str = field(default_factory=socket.gethostname)
    buckets: int = DEFAULT_BUCKETS
    sample_every: int = 1  # forward 1 op in N (by a hash of comm and seq); 1: all
    window_s: float = 1.0  # heartbeats and summaries
    flush_s: float = 0.1  # batches
    intake_bytes: int = AGENT_INTAKE_BYTES
    status_file: Path | None = None
    ready_file: Path | None = None


@dataclass
class ProcInfo:
    """One plugin connection as the agent forwards it."""

    host: str
    pid: int
    job: str | None
    connection: int
    dropped: int
    buckets: set[int] = field(default_factory=set)  # where its comms' records went
    lost: int = 0  # its records this agent dropped
    last_ts: int = 0
    exited: bool = False
    records: int = 0


@dataclass
class AgentCounters:
    messages: int = 0
    bytes: int = 0  # compressed, as sent
    raw_bytes: int = 0
    records: int = 0
    sampled_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # records, by reason
    heartbeats: int = 0
    summaries: int = 0


class Agent:
    """See module doc."""

    def __init__(self, cfg: AgentConfig, err: TextIO | None = None) -> None:
        self.cfg = cfg
        self.err = err or sys.stderr
        self.addresses = [parse_address(a) for a in cfg.listen]
        self.intake = Intake(cfg.intake_bytes)
        self.server = StreamServer(self.intake, cfg.token, self.err)
        self.bus = BusCounters()
        self.counters = AgentCounters()
        self.procs: dict[str, ProcInfo] = {}
        self.nc: Any = None
        self._pending: dict[tuple[str | None, int], dict[str, Part]] = {}
        self._summary: dict[tuple, list[int]] = {}
        self._number = 0
        self._stop = asyncio.Event()

    # ------------------------------------------------------------------ running
    def run(self) -> int:
        return asyncio.run(self._main())

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)
        bound = [str(await self.server.listen(a)) for a in self.addresses]
        connecting = asyncio.create_task(self._connect())
        print(f"rankwatch agent {self.cfg.name}: streams on {', '.join(bound)}; "
              f"publishing to {self.cfg.nats}", file=self.err, flush=True)  # fmt: skip
        if self.cfg.ready_file is not None:
            _write_atomic(self.cfg.ready_file, json.dumps({"pid": os.getpid(), "listen": bound}))
        next_window = time.monotonic() + self.cfg.window_s
        try:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.cfg.flush_s)
                await self.pump()
                if time.monotonic() >= next_window:
                    next_window += self.cfg.window_s
                    await self.window()
        finally:
            await self.server.close()
            await self.pump()
            await self.window()
            connecting.cancel()
            if self.nc is not None:
                with contextlib.suppress(Exception):
                    await self.nc.drain()
        return 0

    async def _connect(self) -> None:
        self.nc = await connect_retrying(self.cfg.nats, f"agent-{self.cfg.name}", self.bus,
                                         self._stop)  # fmt: skip

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    # ------------------------------------------------------------------ routing
    async def pump(self) -> None:
        """Route everything the listener queued, then publish it."""
        while True:
            items = self.intake.take(200_000)
            if not items:
                break
            for item in items:
                if isinstance(item, Chunk):
                    self._route(item)
                elif isinstance(item, Event):
                    self._event(item)
            if not self.intake.queued_bytes:
                break
        await self._publish()

    def _event(self, ev: Event) -> None:
        info = self._info(ev.source)
        if info is None or ev.kind != "close":
            return
        for b in info.buckets:
            self._part(info, ev.source.key, b).closed = True
        self.procs.pop(ev.source.key, None)

    def _info(self, source: Source) -> ProcInfo | None:
        info = self.procs.get(source.key)
        if info is None and source.hello is not None:
            h = source.hello
            info = self.procs[source.key] = ProcInfo(
                h.hostname, h.pid, h.job_id, h.connection, h.stream_dropped_records
            )
        return info

    def _part(self, info: ProcInfo, key: str, bucket: int) -> Part:
        parts = self._pending.setdefault((info.job, bucket), {})
        part = parts.get(key)
        if part is None:
            part = parts[key] = Part(info.host, info.pid, info.job, info.connection,
                                     info.dropped + info.lost)  # fmt: skip
            if bucket not in info.buckets:
                info.buckets.add(bucket)
                part.opened = True
        return part

    def _route(self, chunk: Chunk) -> None:
        info = self._info(chunk.source)
        if info is None:
            return
        key = chunk.source.key
        for line in _lines(chunk.lines.ops):
            self._route_op(info, key, line)
        for line in _lines(chunk.lines.state):
            self._route_state(info, key, line)
        info.records += chunk.lines.records

    def _route_op(self, info: ProcInfo, key: str, line: bytes) -> None:
        comm = op_comm(line) or b""
        seq = op_seq(line)
        self._summarize(info, comm, line, seq)
        if seq is not None and not sampled(comm, seq, self.cfg.sample_every):
            self.counters.sampled_out += 1
            return
        self._part(info, key, bucket_of(comm, self.cfg.buckets)).ops.append(line)

    def _route_state(self, info: ProcInfo, key: str, line: bytes) -> None:
        kind = state_kind(line)
        if kind == "progress":
            m = _TS.search(line)
            info.last_ts = max(info.last_ts, int(m.group(1)) if m else 0)
        if _EXIT in line:
            info.exited = True
        comm = state_comm(line)
        if comm is not None:
            self._part(info, key, bucket_of(comm, self.cfg.buckets)).state.append(line)
            return
        # process-wide (stats): every worker that has one of its communicators needs it
        for b in info.buckets or ():
            self._part(info, key, b).state.append(line)
        if not info.buckets:
            _add(self.counters.dropped, "no_comm_yet", 1)

    def _summarize(self, info: ProcInfo, comm: bytes, line: bytes, seq: int | None) -> None:
        fm, em = _FUNC.search(line), _EXEC.search(line)
        k = (info.job, comm.decode(), info.host, info.pid, fm.group(1).decode() if fm else "")
        s = self._summary.get(k)
        n = seq if seq is not None else -1
        ns = int(em.group(1)) if em else 0
        if s is None:
            self._summary[k] = [1, n, n, ns]
        else:
            s[0] += 1
            s[1], s[2], s[3] = min(s[1], n), max(s[2], n), s[3] + ns

    # ------------------------------------------------------------------ publishing
    async def _publish(self) -> None:
        pending, self._pending = self._pending, {}
        for (job, bucket), parts in pending.items():
            subject = ops_subject(job, bucket)
            for batch in self._fit(list(parts.values())):
                await self._send_batch(subject, batch)

    def _fit(self, parts: list[Part]) -> list[list[Part]]:
        """Parts in batches whose raw size keeps each message under the limit (JSON
        lines compress ~10x; a batch of 4x the limit raw is safely under it)."""
        out: list[list[Part]] = [[]]
        size = 0
        for p in _split_big(parts, 4 * MAX_MESSAGE):
            if out[-1] and size + p.nbytes > 4 * MAX_MESSAGE:
                out.append([])
                size = 0
            out[-1].append(p)
            size += p.nbytes
        return [b for b in out if b]

    async def _send_batch(self, subject: str, parts: list[Part]) -> None:
        if not self.connected:
            # op records go first: state records (hang detection) wait in the client's
            # reconnect buffer while it has room
            self._drop_ops(parts, "nats_down")
        self._number += 1
        data, raw = encode_batch(self.cfg.name, self._number, parts)
        n = sum(p.records for p in parts)
        if await self._send(subject, data):
            c = self.counters
            c.messages += 1
            c.bytes += len(data)
            c.raw_bytes += raw
            c.records += n
        else:
            for p in parts:
                self._lose(p, p.records, "nats_unavailable")

    def _drop_ops(self, parts: list[Part], reason: str) -> None:
        for p in parts:
            if p.ops:
                self._lose(p, len(p.ops), reason)
                p.ops = []

    def _lose(self, part: Part, n: int, reason: str) -> None:
        _add(self.counters.dropped, reason, n)
        for info in self.procs.values():
            if (info.host, info.pid, info.connection) == (part.host, part.pid, part.connection):
                info.lost += n

    async def _send(self, subject: str, data: bytes) -> bool:
        if self.nc is None or self.nc.is_closed:
            return False
        try:
            await self.nc.publish(subject, data)
            return True
        except Exception:  # buffer full while reconnecting, or closed: the caller counts
            return False

    async def window(self) -> None:
        """Per-window heartbeats and summaries, then the status file."""
        await self.pump()
        now = time.time()
        by_job: dict[str | None, list[dict]] = {}
        for info in self.procs.values():
            by_job.setdefault(info.job, []).append(
                {
                    "host": info.host,
                    "pid": info.pid,
                    "conn": info.connection,
                    "ts_ns": info.last_ts,
                    "exited": info.exited,
                    "records": info.records,
                    "lost": info.lost,
                    "buckets": sorted(info.buckets),
                }  # fmt: skip
            )
        for job, procs in by_job.items():
            body = {"agent": self.cfg.name, "t": now, "job": job, "procs": procs}
            if await self._send(progress_subject(job), json.dumps(body).encode()):
                self.counters.heartbeats += 1
        await self._send_summaries(now)
        self._write_status()

    async def _send_summaries(self, now: float) -> None:
        rows, self._summary = self._summary, {}
        by_job: dict[str | None, list[list]] = {}
        for (job, comm, host, pid, func), (n, lo, hi, ns) in rows.items():
            by_job.setdefault(job, []).append([comm, host, pid, func, n, lo, hi, ns])
        for job, table in by_job.items():
            body = {"agent": self.cfg.name, "t": now, "job": job,
                    "columns": ["comm", "host", "pid", "func", "n", "seq_min", "seq_max",
                                "exec_ns"], "rows": table}  # fmt: skip
            data = zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 1)
            if await self._send(summary_subject(job), data):
                self.counters.summaries += 1
            else:
                _add(self.counters.dropped, "summary_rows", len(table))

    def status(self) -> dict[str, Any]:
        c, ic = self.counters, self.intake.counters
        dropped = dict(c.dropped)
        for reason, n in ic.dropped.items():  # the agent's own backlog overflowed
            _add(dropped, "agent_" + reason, n)
        return {
            "name": self.cfg.name, "connected": self.connected,
            "received": dict(ic.received), "published": {
                "messages": c.messages, "bytes": c.bytes, "raw_bytes": c.raw_bytes,
                "records": c.records, "heartbeats": c.heartbeats, "summaries": c.summaries},
            "sampled_out": c.sampled_out, "dropped": dropped,
            "nats": {"disconnects": self.bus.disconnects, "reconnects": self.bus.reconnects,
                     "errors": self.bus.errors, "last_error": self.bus.last_error},
            "streams": {"connections": self.server.counters.connections,
                        "rejected": dict(self.server.counters.rejected)},
        }  # fmt: skip

    def _write_status(self) -> None:
        if self.cfg.status_file is not None:
            _write_atomic(self.cfg.status_file, json.dumps(self.status()))


def _lines(blob: bytes) -> list[bytes]:
    """Lines of a joined blob, each with its newline (as they go on the wire)."""
    return [line + b"\n" for line in blob.split(b"\n") if line]


def _split_big(parts: list[Part], limit: int) -> list[Part]:
    """A part bigger than limit becomes several (same process, lines in order; only the
    first keeps `opened`, only the last `closed`)."""
    out = []
    for p in parts:
        if p.nbytes <= limit:
            out.append(p)
            continue
        lines = [(True, x) for x in p.ops] + [(False, x) for x in p.state]
        pieces: list[Part] = []
        size = limit + 1
        for is_op, line in lines:
            if size + len(line) > limit:
                pieces.append(Part(p.host, p.pid, p.job, p.connection, p.dropped))
                size = 0
            (pieces[-1].ops if is_op else pieces[-1].state).append(line)
            size += len(line)
        pieces[0].opened, pieces[-1].closed = p.opened, p.closed
        out += pieces
    return out


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


def _write_atomic(path: Path, text: str) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
