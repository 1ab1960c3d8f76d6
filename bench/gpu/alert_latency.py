#!/usr/bin/env python3
"""When `rankwatch run --monitor` alerted, against when the injected fault began.

    python bench/gpu/alert_latency.py RUN

RUN.log is the run's output with each line prefixed by the wall-clock ns it appeared
at (bench/gpu/run_final.sh writes it so); RUN/job holds train_lm.py's truth and step
files. For a straggler the fault begins when the fault rank starts its first faulty
step; for a hang, when rank 0 finished its last step (it then waited for good).
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path


def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def main(run: str) -> int:
    truth = json.loads(Path(f"{run}/job/truth-rank0.json").read_text())
    steps = {
        int(f.split("rank")[-1].split(".")[0]): [json.loads(line) for line in _lines(f)]
        for f in glob.glob(f"{run}/job/steps-rank*.jsonl")
    }
    alerts = []
    for line in _lines(f"{run}.log"):
        stamp, _, text = line.partition(" ")
        if "ALERT" in text:
            alerts.append((int(stamp), text.strip()))
    if truth["fault"] == "hang":
        onset = steps[0][-1]["end_ns"]
    else:
        rank_steps = steps[truth["fault_rank"]]
        onset = next(s["start_ns"] for s in rank_steps if s["step"] == truth["fault_step"])
    for t, text in alerts:
        print(f"alert {(t - onset) / 1e9:+.2f} s after the fault began: {text[:200]}")
    if not alerts:
        print("no alert")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
