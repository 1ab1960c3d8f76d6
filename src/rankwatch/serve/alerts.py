"""Alerts for new findings: one line on stdout each, and a JSON POST to a webhook
URL when one is given.

The webhook runs on its own thread behind a bounded queue with a timeout per
request, so a slow or dead receiver never delays detection; alerts that do not
fit the queue are dropped and counted (the findings stay on the page and in
/api/state).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, TextIO

from rankwatch import __version__
from rankwatch.model import Finding
from rankwatch.serve.job import jsonable
from rankwatch.serve.live import NewFinding

WEBHOOK_TIMEOUT_S = 5.0
WEBHOOK_QUEUE = 256


def describe(job: str, f: Finding) -> str:
    """One line for people: what, who, where, since when."""
    gpu = f", GPU {f.device}" if f.device is not None else ""
    who = f"rank {f.rank} ({f.host}, pid {f.pid}{gpu})" if f.rank is not None else "communicator"
    comm = f.comm.name or f.comm.id if f.comm is not None else None
    parts = [f"job {job}: {f.kind}: {who}"]
    if comm:
        parts.append(f"on {comm}")
    op = (f.evidence or {}).get("op") or (f.evidence or {}).get("onset") or {}
    if f.since is not None and f.since.seq is not None:
        parts.append(f"since {op.get('func', 'op')} #{f.since.seq}")
    if f.cause:
        parts.append(f"cause {f.cause}")
    if f.cost_s is not None:
        parts.append(f"cost {f.cost_s:.3f} s")
    return " ".join(parts) + f" (confidence {f.confidence:.2f})"


def payload(job: str, f: Finding) -> dict[str, Any]:
    return {
        "source": "rankwatch",
        "version": __version__,
        "job": job,
        "time": time.time(),
        "summary": describe(job, f),
        "finding": jsonable(f.to_dict()),
    }


class Alerts:
    """stdout plus an optional webhook (see module doc)."""

    def __init__(self, webhook: str | None = None, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.webhook = webhook
        self.counts: dict[str, int] = {}  # "sink:outcome" -> alerts
        self._queue: queue.Queue[dict | None] = queue.Queue(WEBHOOK_QUEUE)
        self._thread: threading.Thread | None = None
        if webhook:
            self._thread = threading.Thread(target=self._post_loop, name="rankwatch-webhook")
            self._thread.daemon = True
            self._thread.start()

    def emit(self, new: list[NewFinding]) -> None:
        for n in new:
            print(f"rankwatch monitor: ALERT {describe(n.job, n.finding)}", file=self.out)
            self._count("stdout", "sent")
            if self.webhook:
                try:
                    self._queue.put_nowait(payload(n.job, n.finding))
                except queue.Full:
                    self._count("webhook", "dropped")
        if new:
            self.out.flush()

    def close(self, timeout: float = WEBHOOK_TIMEOUT_S) -> None:
        """Let queued webhook posts finish (up to timeout)."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _count(self, sink: str, outcome: str) -> None:
        key = f"{sink}:{outcome}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def _post_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            self._post(item)

    def _post(self, item: dict) -> None:
        assert self.webhook is not None
        body = json.dumps(item).encode()
        req = urllib.request.Request(
            self.webhook, body, {"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT_S) as resp:
                resp.read(1024)
            self._count("webhook", "sent")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._count("webhook", "failed")
            print(f"rankwatch monitor: webhook {self.webhook}: {exc}", file=sys.stderr)
