"""`rankwatch monitor`: one process that takes the streams (and/or tails the files)
of every rank of one or more jobs, runs the detectors live, and serves metrics,
a live page and alerts.

Threads: the asyncio loop (main thread) owns every socket (stream listeners,
HTTP) and the file watchers, and only moves bytes into the Intake; one
processing thread takes a batch from the Intake every tick, folds it into the
LiveState (DuckDB, the detectors), emits alerts for new findings and publishes
a snapshot that HTTP responses are made from. So a slow batch never stalls
reading or serving, and a slow client never stalls detection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from rankwatch.errors import ConfigError
from rankwatch.serve.alerts import Alerts, describe
from rankwatch.serve.intake import DEFAULT_LIMIT_BYTES, Intake
from rankwatch.serve.listener import Address, StreamServer, is_loopback, parse_address
from rankwatch.serve.live import LiveState, StateConfig
from rankwatch.serve.parquet import ParquetSink
from rankwatch.serve.watch import Watcher
from rankwatch.serve.web import WebServer

DEFAULT_LISTEN = "tcp://127.0.0.1:9471"
DEFAULT_HTTP = "127.0.0.1:9470"
TICK_S = 0.5
MAX_BATCH_RECORDS = 20_000  # a step stays short: the hang fast lane runs between steps
FAST_LANE_LAG_S = 0.5  # main queue delay above which progress takes the fast lane


@dataclass
class MonitorConfig:
    listen: list[str] = field(default_factory=lambda: [DEFAULT_LISTEN])
    http: str | None = DEFAULT_HTTP  # host:port, None: no HTTP
    watch: list[Path] = field(default_factory=list)
    token: str | None = None
    webhook: str | None = None
    parquet: Path | None = None
    tick_s: float = TICK_S
    max_batch_records: int = MAX_BATCH_RECORDS
    intake_bytes: int = DEFAULT_LIMIT_BYTES
    state: StateConfig = field(default_factory=StateConfig)
    ready_file: Path | None = None


def parse_http(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{text!r}: expected HOST:PORT (PORT 0: any free port)", field="--http")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class Feed(Protocol):
    """A source of records besides the stream listeners and file watchers (the NATS
    subscriptions of a scale-out worker): it puts what it receives into the Intake
    it was made with, and runs on the monitor's event loop."""

    section: str  # its entry in the snapshot's "monitor" section (stats())

    async def start(self) -> None: ...  # connect; a ConfigError stops the monitor

    async def run(self) -> None: ...  # until cancelled

    async def close(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class Monitor:
    """See module doc. `feeds`: makers of further sources, each given the Intake."""

    def __init__(
        self,
        cfg: MonitorConfig,
        out: TextIO | None = None,
        err: TextIO | None = None,
        feeds: Sequence[Callable[[Intake], Feed]] = (),
    ) -> None:
        self.cfg = cfg
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.addresses = [parse_address(a) for a in cfg.listen]
        self.http = parse_http(cfg.http) if cfg.http else None
        self._check_safety(has_feeds=bool(feeds))
        self.intake = Intake(cfg.intake_bytes)
        self.feeds = [make(self.intake) for make in feeds]
        self.parquet = ParquetSink(cfg.parquet) if cfg.parquet else None
        self.state: LiveState | None = None
        self.alerts = Alerts(cfg.webhook, self.out)
        self.server = StreamServer(self.intake, cfg.token, self.err)
        self.watchers = [Watcher(d, self.intake) for d in cfg.watch]
        self.web: WebServer | None = None
        self.endpoints: dict[str, Any] = {}
        self._snapshot: dict[str, Any] = {"monitor": {}, "jobs": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shed = 0  # intake drops already told to the jobs
        self.final: list = []

    def _check_safety(self, has_feeds: bool) -> None:
        if self.http and not is_loopback(self.http[0]) and not self.cfg.token:
            raise ConfigError(
                f"HTTP on {self.http[0]} is not loopback: set a shared token (--token or "
                "RANKWATCH_COLLECTOR_TOKEN); scrapers send it as a bearer token",
                field="--http",
            )
        if not self.addresses and not self.cfg.watch and not has_feeds:
            raise ConfigError("nothing to monitor: give --listen and/or --watch")

    # ------------------------------------------------------------------ running
    def run(self) -> int:
        """Serve until SIGINT/SIGTERM (or stop()); returns the exit code."""
        return asyncio.run(self._main())

    def stop(self) -> None:
        self._stop.set()

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stopping.set)
        self.state = LiveState(self.cfg.state, self.err, self._on_batch)
        tasks: list[asyncio.Task] = []
        try:
            await self._start(tasks)
            self._thread = threading.Thread(target=self._process, name="rankwatch-process")
            self._thread.start()
            while not stopping.is_set() and not self._stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 0.2)
        finally:
            await self._shutdown(tasks)
        return 0

    async def _start(self, tasks: list[asyncio.Task]) -> None:
        for feed in self.feeds:
            await feed.start()
            tasks.append(asyncio.create_task(feed.run()))
        bound = [str(await self.server.listen(a)) for a in self.addresses]
        url = None
        if self.http:
            token = self.cfg.token if not is_loopback(self.http[0]) else None
            self.web = WebServer(self.snapshot, token, self.cfg.state.max_ranks_series)
            port = await self.web.listen(*self.http)
            host = self.http[0]
            url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
        for w in self.watchers:
            tasks.append(asyncio.create_task(w.run()))
        self.endpoints = {"pid": os.getpid(), "listen": bound, "http": url,
                          "watch": [str(d) for d in self.cfg.watch]}  # fmt: skip
        parts = [f"streams on {', '.join(bound)}" if bound else None,
                 f"watching {', '.join(self.endpoints['watch'])}" if self.watchers else None,
                 f"page and /metrics at {url}" if url else None]  # fmt: skip
        print("rankwatch monitor: " + "; ".join(p for p in parts if p), file=self.err, flush=True)
        if self.cfg.ready_file is not None:
            _write_atomic(self.cfg.ready_file, json.dumps(self.endpoints))

    async def _shutdown(self, tasks: list[asyncio.Task]) -> None:
        for feed in self.feeds:
            await feed.close()
        await self.server.close()
        for t in tasks:
            t.cancel()
        for w in self.watchers:  # what the files hold now is part of the job
            for tail in list(w.tails.values()):
                while w.poll(tail):
                    pass
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self.web is not None:
            await self.web.close()
        self.alerts.close()
        if self.state is not None:
            self.state.close()

    # ------------------------------------------------------------------ processing
    def _process(self) -> None:
        assert self.state is not None
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                self._step()
                rest = self.cfg.tick_s - (time.monotonic() - started)
                if rest > 0 and self.intake.queued_bytes < (1 << 20):
                    self._stop.wait(rest)
            while self.intake.queued_bytes or self.intake.wait(0):
                self._step()
            self._finish()
        except Exception as exc:  # the thread must say why it stopped, loudly
            print(f"rankwatch monitor: processing stopped: {exc!r}", file=self.err)
            raise

    def _step(self) -> None:
        assert self.state is not None
        shed = sum(self.intake.counters.dropped.values())
        if shed > self._shed:
            self.state.note_dropped(shed - self._shed)
            self._shed = shed
        fast = self.intake.take_fast()
        # only worth its cost when the main queue is behind; otherwise the main path
        # reaches these lines within this very tick
        if fast and self.intake.lag() > FAST_LANE_LAG_S:
            try:
                self.state.accept_fast(fast)
            except Exception as exc:  # the main path still carries these lines
                print(f"rankwatch monitor: hang fast lane: {exc!r}", file=self.err)
        items = self.intake.take(self.cfg.max_batch_records)
        if items:
            try:
                self.state.accept(items)
            except Exception as exc:  # one bad batch must not end the service
                n = sum(i.lines.records for i in items if hasattr(i, "lines"))
                d = self.state.dropped
                d["batch_failed"] = d.get("batch_failed", 0) + n
                print(f"rankwatch monitor: a batch of {n} records failed: {exc!r}", file=self.err)
        self.alerts.emit(self.state.tick())
        self._publish()

    def _finish(self) -> None:
        assert self.state is not None
        self.alerts.emit(self.state.finish_all())
        if self.parquet is not None:
            self.parquet.flush()
        self._publish()
        self._summary()

    def _on_batch(self, job: str, tables: dict) -> None:
        if self.parquet is not None:
            self.parquet.add(job, tables)

    def _summary(self) -> None:
        """What the monitor found, per job, when it stops."""
        for job in self._snapshot["jobs"]:
            n = len(job["findings"])
            print(
                f"rankwatch monitor: job {job['key']}: {len(job['ranks'])} ranks, "
                f"{job['records']['op']} op records, {n} finding(s)",
                file=self.out,
            )
        for key, job in self.state.jobs.items() if self.state else []:
            for f in job.findings():
                print(f"  {describe(key, f)}", file=self.out)
        self.out.flush()

    # ------------------------------------------------------------------ snapshot
    def _publish(self) -> None:
        assert self.state is not None
        c = self.server.counters
        transport = {
            "frames": c.frames,
            "bytes": c.bytes,
            "connections": c.connections,
            "open": c.open,
            "frames_rejected": _copy(c.rejected),
            "intake_lag_s": self.intake.lag(),
            "watched_files": sum(len(w.tails) for w in self.watchers),
            "alerts": dict(self.alerts.counts),
            "endpoints": self.endpoints,
        }
        if self.parquet is not None:
            transport["parquet"] = dict(self.parquet.written)
            transport["parquet_dropped"] = self.parquet.dropped
        snapshot = self.state.snapshot(self.intake, transport)
        for feed in self.feeds:
            snapshot["monitor"][feed.section] = feed.stats()
        self._snapshot = snapshot  # one assignment: HTTP threads read it whole

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot


def _copy(d: dict) -> dict:
    """A copy of a dict another thread may be adding keys to."""
    for _ in range(5):
        with contextlib.suppress(RuntimeError):
            return dict(d)
    return {}


def _write_atomic(path: Path, text: str) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def address_list(values: tuple[str, ...]) -> list[str]:
    """--listen values; `none` turns listening off."""
    if any(v == "none" for v in values):
        return []
    return list(values) or [DEFAULT_LISTEN]


__all__ = ["Address", "Monitor", "MonitorConfig", "address_list", "parse_http"]
