"""Finding record files under the paths a user gives, and telling what they are.

Op files: rankwatch `<host>-pid<pid>.log` and NCCL/RCCL Inspector output
(`*.log`, `*.json`, `*.jsonl`, plain or `.gz`). State files:
`*.rwstate.jsonl[.gz]`. A file's first line decides whether an op file holds
rankwatch records (they carry a `rankwatch` object) or Inspector records; a
`.json`/`.jsonl` file that does not look like records at all (a truth.json, a
config) is skipped, while a `-pid<N>.log` file is always read so that its
damage gets reported.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rankwatch.errors import RecordError

STATE_SUFFIX = re.compile(r"\.rwstate\.jsonl(\.gz)?$")
OP_SUFFIX = re.compile(r"\.(log|json|jsonl)(\.gz)?$")
PID_LOG = re.compile(r"-pid\d+\.log(\.gz)?$")
SNIFF_BYTES = 1 << 16


@dataclass(frozen=True)
class RecordFile:
    path: str
    role: str  # "ops" or "state"
    format: str  # "rankwatch", "inspector" or "unknown" (first line unreadable)
    compressed: bool
    size: int


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


def _open(path: str, compressed: bool):
    return gzip.open(path, "rb") if compressed else open(path, "rb")  # noqa: SIM115


def first_line(path: str, compressed: bool) -> bytes:
    """The first line (up to 64 KiB) of a file, decompressed."""
    try:
        with _open(path, compressed) as stream:
            return stream.readline(SNIFF_BYTES)
    except (OSError, EOFError) as exc:
        raise RecordError(f"cannot read: {exc}", file=path) from exc


def _classify(line: bytes) -> tuple[str, str] | None:
    """(role, format) of a record line, None if it is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if "header" in obj and any(
        k in obj for k in ("coll_perf", "p2p_perf", "dump_stats", "proxy_trace")
    ):
        return "ops", ("rankwatch" if "rankwatch" in obj else "inspector")
    if "schema" in obj and obj.get("kind") in ("comm", "progress", "clock", "stats"):
        return "state", "rankwatch"
    return None


def inspect_file(path: str) -> RecordFile | Skipped:
    name = os.path.basename(path)
    compressed = name.endswith(".gz")
    if not (STATE_SUFFIX.search(name) or OP_SUFFIX.search(name)):
        return Skipped(path, "not a record file name")
    size = os.path.getsize(path)
    line = first_line(path, compressed)
    kind = _classify(line) if line.strip() else None
    if kind is not None:
        return RecordFile(path, kind[0], kind[1], compressed, size)
    if STATE_SUFFIX.search(name):
        return RecordFile(path, "state", "rankwatch", compressed, size)
    if PID_LOG.search(name):
        return RecordFile(path, "ops", "unknown", compressed, size)
    return Skipped(path, "first line is not an op or state record")


def _walk(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if not f.startswith(".")]
    return found


def discover(paths: list[str | os.PathLike[str]]) -> tuple[list[RecordFile], list[Skipped]]:
    """Record files under paths (files or directories, searched recursively)."""
    candidates: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            candidates += _walk(path)
        elif path.is_file():
            candidates.append(str(path))
        else:
            raise RecordError("no such file or directory", file=str(path))
    files, skipped = [], []
    for c in dict.fromkeys(candidates):  # keep order, drop duplicates
        result = inspect_file(c)
        (files if isinstance(result, RecordFile) else skipped).append(result)
    return files, skipped
