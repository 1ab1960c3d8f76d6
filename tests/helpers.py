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


def build_sanitized(binary: Path, sources: list[str], *flags: str) -> None:
    """Build a fuzz driver from native/ sources under ASan and UBSan (pytest.skip
    where the sanitizer runtime is missing; the build's errors otherwise)."""
    import pytest

    cc = c_compiler()
    assert cc is not None
    build = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", *flags,
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", f"-I{NATIVE_DIR}", "-o", str(binary),
         *(str(NATIVE_DIR / src) for src in sources), "-lm"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"sanitizer runtime not available: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr


def run_sanitized(binary: Path, *args: str) -> str:
    """Run a sanitized fuzz driver (leak checks on); asserts it printed "ok:"."""
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok:"), done.stdout
    return done.stdout


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


def chunk_rows_default(rows: int) -> tuple[Any, ...]:
    """rankwatch.store.native.Reader.__init__'s defaults with chunks of `rows` rows
    (for monkeypatch.setattr(Reader.__init__, "__defaults__", ...))."""
    from rankwatch.store import native

    defaults = native.Reader.__init__.__defaults__
    assert defaults is not None
    return (rows, *defaults[1:])
