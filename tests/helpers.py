"""Shared test helpers: repository paths, record loading, running the CLI for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORD_FORMAT_DOC = REPO_ROOT / "docs" / "record-format.md"
NATIVE_DIR = REPO_ROOT / "native"


def c_compiler() -> str | None:
    """The C compiler for the sanitizer builds of the tests ($CC, cc, gcc or clang)."""
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def load_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file as a dict; fails naming file:line on a bad line."""
    records = []
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise AssertionError(f"{path}:{number}: not JSON: {exc}") from exc
            if not isinstance(record, dict):
                raise AssertionError(f"{path}:{number}: not a JSON object")
            records.append(record)
    return records


def rankwatch(
    *args: str, cwd: str | os.PathLike[str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m rankwatch ARGS` as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "rankwatch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
