"""A synthetic distributed training job written as rankwatch records.

`simulate(SimConfig(...), outdir)` writes per-process `<host>-pid<pid>.log` op
records and `.rwstate.jsonl` state records exactly as the plugin would, plus a
`truth.json` with what was injected (clock offsets, slow / hung / desynced
ranks), so the analysis can be tested against known answers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwatch.simulate.config import DesyncFault, HangFault, SimConfig, SlowFault
from rankwatch.simulate.truth import TRUTH_FILE, build_truth
from rankwatch.simulate.writer import Job, write_job

__all__ = ["DesyncFault", "HangFault", "SimConfig", "SimResult", "SlowFault", "simulate"]


@dataclass(frozen=True)
class SimResult:
    outdir: Path
    truth: dict[str, Any]

    @property
    def op_records(self) -> int:
        return int(self.truth["records"]["ops"])


def simulate(cfg: SimConfig, outdir: str | os.PathLike[str]) -> SimResult:
    """Write the job's records and truth.json into outdir (created if needed)."""
    out = Path(outdir)
    summaries = write_job(cfg, out)
    truth = build_truth(Job.build(cfg), summaries)
    tmp = out / f".{TRUTH_FILE}.tmp"
    tmp.write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / TRUTH_FILE)
    return SimResult(out, truth)
