"""Running the real plugin under the fake NCCL driver (plugin/tests/fake_nccl)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from helpers import REPO_ROOT, load_jsonl
from rankwatch.collect.plugin import plugin_path

DRIVER_DIR = REPO_ROOT / "plugin" / "tests"
CAPTURES = REPO_ROOT.parent / "shared" / "reference" / "real-nccl-callbacks"


@lru_cache(maxsize=1)
def driver_binary() -> Path:
    """Builds the driver once per session (make is incremental)."""
    subprocess.run(["make", "-s", "-C", str(DRIVER_DIR), "driver"], check=True, timeout=300)
    return DRIVER_DIR / "build" / "fake_nccl"


@dataclass
class DriverRun:
    summary: dict[str, Any]
    dump: Path
    returncode: int
    stderr: str

    def op_records(self) -> list[dict[str, Any]]:
        return [r for f in sorted(self.dump.glob("*.log")) for r in load_jsonl(f)]

    def state_records(self, kind: str | None = None) -> list[dict[str, Any]]:
        records = [r for f in sorted(self.dump.glob("*.rwstate.jsonl")) for r in load_jsonl(f)]
        return [r for r in records if kind is None or r["kind"] == kind]


def run_driver(
    dump: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120, **popen: Any
) -> DriverRun:
    """Runs one driver process with the installed plugin writing to `dump`."""
    full_env = {**os.environ, "RANKWATCH_DUMP_DIR": str(dump), **(env or {})}
    proc = subprocess.run(
        [str(driver_binary()), *args, str(plugin_path())],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **popen,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    return DriverRun(summary, dump, proc.returncode, proc.stderr)


def issued_colls(summary: dict[str, Any]) -> dict[tuple[str, int, str], int]:
    """(comm id, rank, func) -> complete collectives the driver issued."""
    out: dict[tuple[str, int, str], int] = {}
    for comm in summary["comms"]:
        for func, n in comm["colls"].items():
            if n:
                out[(comm["comm_id"], comm["rank"], func)] = n
    return out


def recorded_colls(records: list[dict[str, Any]]) -> dict[tuple[str, int, str], int]:
    out: dict[tuple[str, int, str], int] = {}
    for r in records:
        if "coll_perf" in r and r["rankwatch"]["complete"]:
            key = (r["header"]["id"], r["header"]["rank"], r["coll_perf"]["coll"])
            out[key] = out.get(key, 0) + 1
    return out
