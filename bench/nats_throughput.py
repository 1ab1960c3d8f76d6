"""Throughput of one node's `rankwatch agent` -> nats-server -> a consumer.

Simulates one node (8 ranks, TP 8, one host) with rankwatch.simulate, replays its
record lines through 8 stream connections into a real `rankwatch agent` at a target
rate, and counts what a subscriber on the bucket subjects receives (messages,
compressed bytes, records after decoding). Prints one JSON line.

Usage: python bench/nats_throughput.py [--rate 10000] [--seconds 10] [--sample 1]
Needs nats-server on PATH and nats-py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankwatch.serve.nats_bus import decode_batch
from rankwatch.serve.sender import StreamSender, process_files
from rankwatch.simulate import SimConfig, simulate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit("nats-server did not start")


def feed(listen: str, dump: Path, rate: float, seconds: float) -> int:
    """Replay the node's lines round-robin over its processes at `rate` lines/s."""
    procs = process_files(dump)
    senders = [StreamSender(listen, p.host, p.pid, job_id="bench") for p in procs]
    lines = [[x for _, x in p.lines()] for p in procs]
    sent, start, chunk = 0, time.monotonic(), max(1, int(rate / 100))
    while time.monotonic() - start < seconds:
        for s, ls in zip(senders, lines, strict=True):
            i = (sent // len(senders)) % max(1, len(ls) - chunk)
            s.send(b"".join(ls[i : i + chunk // len(senders) + 1]))
        sent += chunk
        ahead = sent / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    for s in senders:
        s.close()
    return sent


async def consume(url: str, until: asyncio.Event, out: dict) -> None:
    import nats

    nc = await nats.connect(url)

    async def on(msg) -> None:  # noqa: ANN001
        out["messages"] += 1
        out["bytes"] += len(msg.data)
        _, parts = decode_batch(msg.data)
        out["records"] += sum(p.head["n_ops"] + p.head["n_state"] for p in parts)

    await nc.subscribe("rankwatch.*.ops.*", cb=on, pending_bytes_limit=1 << 30)
    await until.wait()
    await nc.drain()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--sample", type=int, default=1)
    a = ap.parse_args()
    server = shutil.which("nats-server") or sys.exit("nats-server not on PATH")
    tmp = Path(tempfile.mkdtemp(prefix="rw-nats-bench-"))
    simulate(SimConfig(ranks=8, hosts=1, tp=8, steps=400, job_id="bench"), tmp / "node")
    port = free_port()
    nats_proc = subprocess.Popen([server, "-a", "127.0.0.1", "-p", str(port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wait_port(port)
    url, listen, status = f"nats://127.0.0.1:{port}", f"unix:{tmp}/a.sock", tmp / "status.json"
    agent = subprocess.Popen([sys.executable, "-m", "rankwatch", "agent", "--listen", listen,
                              "--nats", url, "--status-file", str(status),
                              "--sample", str(a.sample), "--name", "bench"])  # fmt: skip
    while not os.path.exists(f"{tmp}/a.sock"):
        time.sleep(0.05)
    out = {"messages": 0, "bytes": 0, "records": 0}

    async def run() -> float:
        until = asyncio.Event()
        task = asyncio.create_task(consume(url, until, out))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        sent = await asyncio.to_thread(feed, listen, tmp / "node", a.rate, a.seconds)
        await asyncio.sleep(2.0)  # the agent's last batches
        until.set()
        await task
        return sent, time.monotonic() - t0 - 2.0

    sent, secs = asyncio.run(run())
    cpu = _cpu_s(agent.pid)
    agent.terminate()
    agent.wait(30)
    st = json.loads(status.read_text())
    nats_proc.kill()
    pub = st["published"]
    print(json.dumps({
        "target_rate": a.rate, "seconds": round(secs, 2), "sent_lines": sent,
        "lines_per_s": round(sum(st["received"].values()) / secs), "agent_received": st["received"],
        "published_records": pub["records"], "raw_bytes_per_s": round(pub["raw_bytes"] / secs),
        "nats_bytes_per_s": round(pub["bytes"] / secs), "compression": round(
            pub["raw_bytes"] / max(1, pub["bytes"]), 1),
        "messages_per_s": round(pub["messages"] / secs), "consumer": out,
        "agent_cpu_s_per_s": round(cpu / secs, 3), "dropped": st["dropped"],
        "sample_every": a.sample,
    }))  # fmt: skip
    shutil.rmtree(tmp, ignore_errors=True)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
