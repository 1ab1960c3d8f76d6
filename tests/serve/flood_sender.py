"""Flood a monitor as ranks whose plugins stream faster than it can take: one
connection per process of a record directory, real record lines offered at a fixed
total rate, in frames of at most 32 KiB behind a 4 MiB queue per connection that
drops its oldest unsent frame when full, as the plugin's stream queue does
(docs/plugin.md). Prints one JSON line.

    python flood_sender.py ADDRESS DIR RECORDS_PER_S SECONDS
"""

from __future__ import annotations

import json
import select
import sys
import time
from collections import deque
from pathlib import Path

from rankwatch.serve.protocol import encode_frame, hello_line
from rankwatch.serve.sender import connect, frames_of, process_files

FRAME_BYTES = 32 * 1024  # the plugin's batches
QUEUE_BYTES = 4 << 20  # RANKWATCH_STREAM_QUEUE_BYTES' default
TICK_S = 0.005


class Conn:
    """A socket with the plugin's bounded queue of frames in front of it."""

    def __init__(self, address: str, proc) -> None:  # noqa: ANN001 - a ProcessFiles
        self.sock = connect(address)
        self.sock.sendall(encode_frame(hello_line(proc.host, proc.pid, job_id=proc.job_id())))
        self.sock.setblocking(False)
        lines = b"".join(line for _, line in proc.lines())
        self.frames = [(encode_frame(f), f.count(b"\n")) for f in frames_of(lines, FRAME_BYTES)]
        self.next = 0
        self.queue: deque[tuple[memoryview, int]] = deque()
        self.queued = 0
        self.dropped = 0
        self.sent = 0
        self.head_started = False

    def offer(self) -> int:
        """Queue the next frame, dropping the oldest frames not yet started to make room."""
        frame, n = self.frames[self.next % len(self.frames)]
        self.next += 1
        while self.queued + len(frame) > QUEUE_BYTES:
            first = 1 if self.head_started else 0  # a frame half sent must go out whole
            if len(self.queue) <= first:
                break
            old, m = self.queue[first]
            del self.queue[first]
            self.queued -= len(old)
            self.dropped += m
        self.queue.append((memoryview(frame), n))
        self.queued += len(frame)
        return n

    def flush(self) -> None:
        while self.queue:
            data, n = self.queue[0]
            try:
                k = self.sock.send(data)
            except BlockingIOError:
                return
            self.queued -= k
            if k < len(data):
                self.queue[0] = (data[k:], n)
                self.head_started = True
                return
            self.queue.popleft()
            self.head_started = False
            self.sent += n


def main(address: str, directory: str, rate: float, seconds: float) -> dict:
    conns = [Conn(address, p) for p in process_files(Path(directory))]
    offered = 0
    start = time.monotonic()
    i = 0
    while (now := time.monotonic()) - start < seconds:
        while offered < rate * (now - start):
            offered += conns[i % len(conns)].offer()
            i += 1
        busy = [c.sock for c in conns if c.queue]
        select.select([], busy, [], TICK_S)
        for c in conns:
            c.flush()
    elapsed = time.monotonic() - start
    left = sum(n for c in conns for _, n in c.queue)
    for c in conns:
        c.sock.close()
    return {
        "offered": offered,
        "sent": sum(c.sent for c in conns),
        "dropped_at_sender": sum(c.dropped for c in conns) + left,
        "seconds": elapsed,
        "offered_per_s": offered / elapsed,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))))
