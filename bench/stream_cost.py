#!/usr/bin/env python3
"""What streaming to a collector costs the plugin's writer thread.

Runs the fake NCCL driver's stress scenario with the plugin, without a collector and
with one (plugin/tests' stream_sink_receiver, which reads and checks every frame),
configurations interleaved round by round. For each run it reports the op records
written per second, the records the stream sent per second, and the CPU time of the
plugin's writer thread (`rankwatch-wr`, from /proc/<pid>/task/<tid>/schedstat, read
every 50 ms; the last read is at most 50 ms before exit).

    python3 bench/stream_cost.py [--rounds 3] [--seconds 8] [--plugin PATH]
                                 [--configs none,unix,tcp] [-- driver args...]

Standard library only. Builds the driver and receiver with `make -C plugin/tests`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "plugin" / "tests"
DRIVER = TESTS / "build" / "fake_nccl"
RECEIVER = TESTS / "build" / "stream_sink_receiver"


def default_plugin() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "plugin-path"], capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit("no plugin: pass --plugin PATH or install rankwatch")
    return out.stdout.strip()


def writer_cpu_ns(pid: int) -> int | None:
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            base = f"/proc/{pid}/task/{tid}"
            with open(f"{base}/comm") as f:
                if f.read().strip() != "rankwatch-wr":
                    continue
            with open(f"{base}/schedstat") as f:
                return int(f.read().split()[0])
    except OSError:
        pass
    return None


def start_receiver(work: Path, listen: str) -> tuple[subprocess.Popen[bytes], str]:
    ready = work / "addr"
    proc = subprocess.Popen(
        [str(RECEIVER), "--listen", listen, "--ready", str(ready), "--out", str(work / "rx.json")]
    )
    for _ in range(200):
        if ready.exists() and ready.read_text().strip():
            return proc, ready.read_text().strip()
        time.sleep(0.02)
    proc.kill()
    sys.exit("the receiver did not start")


def one_run(config: str, plugin: str, driver_args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="rw-stream-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "RANKWATCH_DUMP_DIR": str(work / "dump")}
        receiver = None
        if config != "none":
            listen = f"unix:{work / 'rx.sock'}" if config == "unix" else "tcp"
            receiver, env["RANKWATCH_COLLECTOR"] = start_receiver(work, listen)
        start = time.monotonic()
        proc = subprocess.Popen(
            [str(DRIVER), *driver_args, plugin], env=env, stdout=subprocess.DEVNULL
        )
        cpu = 0
        while proc.poll() is None:
            cpu = writer_cpu_ns(proc.pid) or cpu
            time.sleep(0.05)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            sys.exit(f"driver failed ({proc.returncode})")
        lines = 0
        if receiver:
            receiver.terminate()
            receiver.wait()
            rx = json.loads((work / "rx.json").read_text())
            if rx["errors"]:
                sys.exit(f"receiver: {rx['first_error']}")
            lines = rx["lines"]
        (state,) = (work / "dump").glob("*.rwstate.jsonl")
        stats = [json.loads(x) for x in state.read_text().splitlines() if '"kind":"stats"' in x]
        last = stats[-1]
        records = last["records_written"]
        return {
            "wall_s": wall,
            "records_per_s": records / wall,
            "sent_per_s": last["stream_sent_records"] / wall,
            "received_lines": lines,
            "dropped": last["stream_dropped_records"],
            "dropped_pool_full": last["dropped_pool_full"],
            "writer_cpu_s": cpu / 1e9,
            "writer_us_per_record": cpu / 1e3 / max(records, 1),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--plugin")
    ap.add_argument("--configs", default="none,unix,tcp")
    ap.add_argument("driver_args", nargs="*")
    args = ap.parse_args()
    plugin = args.plugin or default_plugin()
    subprocess.run(["make", "-s", "-C", str(TESTS), "driver", "receiver"], check=True)
    driver_args = args.driver_args or [
        "--scenario", "stress", "--seconds", str(args.seconds), "--threads", "2", "--comms", "2"
    ]  # fmt: skip
    configs = args.configs.split(",")
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for config in configs:
            result = one_run(config, plugin, driver_args)
            runs[config].append(result)
            print(f"round {r + 1} {config:5s} " + json.dumps(result), file=sys.stderr)
    keys = ("records_per_s", "sent_per_s", "dropped", "writer_cpu_s", "writer_us_per_record")
    print("| collector | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for config, results in runs.items():
        cells = [f"{statistics.median(x[k] for x in results):.6g}" for k in keys]
        print(f"| {config} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
