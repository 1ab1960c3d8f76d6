"""`monitor --watch DIR`: tail the plugin's record files as they grow, for setups
where ranks write to a shared file system and nothing streams.

Every `*.log` and `*.rwstate.jsonl` under DIR is read from its start, then
polled for growth; only whole lines (up to their newline) are passed on, the
rest waits for the writer to finish it. Reading waits while the intake is full,
so a watched file never loses a line to overload (the file is still there).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from rankwatch.serve.intake import Intake, Source
from rankwatch.serve.protocol import MAX_PAYLOAD, split_lines

SUFFIXES = (".log", ".rwstate.jsonl")
POLL_S = 0.1
SCAN_S = 1.0
READ = MAX_PAYLOAD  # bytes read per file per poll


@dataclass
class Tail:
    path: Path
    source: Source
    offset: int = 0
    partial: bytes = b""


class Watcher:
    """See module doc."""

    def __init__(self, directory: Path, intake: Intake, poll_s: float = POLL_S) -> None:
        self.directory = Path(directory)
        self.intake = intake
        self.poll_s = poll_s
        self.tails: dict[Path, Tail] = {}
        self.restarted = 0  # files that shrank (rewritten): read again from the start
        self.oversized = 0  # pieces without a newline longer than any record, skipped
        self._scanned = -1e9

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if loop.time() - self._scanned >= SCAN_S:
                self.scan()
                self._scanned = loop.time()
            busy = any([self.poll(t) for t in list(self.tails.values())])
            await asyncio.sleep(0 if busy else self.poll_s)

    def scan(self) -> None:
        """Pick up record files that appeared."""
        if not self.directory.is_dir():
            return
        for root, _, files in os.walk(self.directory):
            for name in files:
                if not name.endswith(SUFFIXES):
                    continue
                path = Path(root) / name
                if path not in self.tails:
                    rel = str(path.relative_to(self.directory))
                    self.tails[path] = Tail(path, Source(f"file:{path}", rel, "watch"))

    def poll(self, t: Tail) -> bool:
        """Pass on whole lines written since the last poll; True when more is waiting."""
        room = min(READ, self.intake.room())
        if room <= 0:
            return False
        try:
            size = os.stat(t.path).st_size
            if size < t.offset:  # rewritten from scratch
                t.offset, t.partial = 0, b""
                self.restarted += 1
            if size == t.offset:
                return False
            with open(t.path, "rb") as f:
                f.seek(t.offset)
                data = f.read(room)
        except OSError:
            return False
        t.offset += len(data)
        data = t.partial + data
        cut = data.rfind(b"\n") + 1
        t.partial = data[cut:]
        if len(t.partial) > MAX_PAYLOAD:  # no record is this long: skip to the next newline
            t.partial = b""
            self.oversized += 1
        if cut:
            self.intake.put(t.source, split_lines(data[:cut]))
        return t.offset < size
