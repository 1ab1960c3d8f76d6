"""The careful reader: one line at a time, for files the fast path could not
take whole. Each bad line is reported once with its file and line number; the
good lines (with wrongly typed non-key fields nulled) are written to a clean
temporary file that the fast path then loads.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rankwatch import schema
from rankwatch.errors import RecordError, SchemaVersionError
from rankwatch.store.discover import RecordFile
from rankwatch.store.problems import ProblemLog

try:  # orjson is optional: about 3x faster to decode
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

BLOCK = 1 << 24
CUT_SHORT = (
    "the compressed stream ends early (the writer stopped mid-file, e.g. the process was "
    "killed): the lines before are kept, nothing after this point could be read"
)


class StreamCut(Exception):
    """A gzip file that ends before its end-of-stream marker, or is damaged there."""


def blocks(rf: RecordFile) -> Iterator[bytes]:
    """The file's bytes, decompressed, in blocks; every byte a cut or damaged gzip
    stream still holds comes out before StreamCut is raised (Python's gzip module
    drops what it had buffered). Concatenated gzip members are read in turn."""
    with open(rf.path, "rb") as raw:
        if not rf.compressed:
            while block := raw.read(BLOCK):
                yield block
            return
        unzip, ended = zlib.decompressobj(wbits=31), True
        while chunk := raw.read(BLOCK):
            while chunk:
                try:
                    out = unzip.decompress(chunk)
                except zlib.error as exc:
                    raise StreamCut(str(exc)) from exc
                if out:
                    yield out
                ended, chunk = unzip.eof, unzip.unused_data if unzip.eof else b""
                if unzip.eof:
                    unzip = zlib.decompressobj(wbits=31)
        if not ended:
            raise StreamCut("no end-of-stream marker")


def count_lines(rf: RecordFile) -> tuple[int, bool]:
    """(non-empty lines, whether the last line ends with a newline), streaming; up to
    the damage in a cut gzip stream."""
    newlines = empty = 0
    prev, first, ends_nl = b"\n", True, True
    try:
        for block in blocks(rf):
            newlines += block.count(b"\n")
            empty += block.count(b"\n\n") + (prev == b"\n" and block[:1] == b"\n" and not first)
            empty += first and block[:1] == b"\n"
            prev, first, ends_nl = block[-1:], False, block.endswith(b"\n")
    except StreamCut:
        pass
    total = newlines + (0 if ends_nl or first else 1)
    return total - empty, ends_nl or first


def iter_lines(rf: RecordFile) -> Iterator[tuple[int, bytes, bool]]:
    """(line number from 1, text without newline, whether it had a newline). A cut
    gzip stream raises StreamCut after its last whole line; the partial line it
    ends with is not yielded (it is what the cut destroyed)."""
    number, rest = 0, b""
    for block in blocks(rf):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            number += 1
            yield number, line.rstrip(b"\r"), True
    if rest:
        yield number + 1, rest.rstrip(b"\r"), False


@dataclass
class Verdict:
    """What to do with one line: keep `record` (maybe repaired), or drop it."""

    record: dict[str, Any] | None
    kind: str = ""  # problem kind, "" when fine
    message: str = ""
    repaired: bool = False
    role: str = "op"  # op, dump_stats, proxy (op files); the state kind (state files)


def decode(text: bytes, has_newline: bool) -> tuple[Any, Verdict | None]:
    try:
        return _loads(text), None
    except ValueError as exc:
        if not has_newline:
            return None, Verdict(
                None,
                "truncated",
                "truncated last line (the writer stopped mid-line, e.g. the process was killed)",
            )
        return None, Verdict(None, "malformed_json", f"not valid JSON: {exc}")


def _type_ok(value: Any, f: schema.Field) -> bool:
    if value is None:
        return True  # nulls are checked only for key fields
    if isinstance(value, bool):
        return f.type == "bool"
    if f.type == "int":
        return isinstance(value, int)
    return isinstance(value, schema._PY_TYPES[f.type])


def null_wrong_types(
    obj: dict[str, Any], fields: tuple[schema.Field, ...], prefix: str
) -> list[str]:
    """Set wrongly typed known fields to None; describe each."""
    problems = []
    for f in fields:
        if f.name in obj and not _type_ok(obj[f.name], f):
            problems.append(
                f"{prefix}{f.name}: expected {f.type}, got {schema.json_type(obj[f.name])}"
            )
            obj[f.name] = None
    return problems


@dataclass
class CleanFile:
    """Good lines of one file, rewritten to a temporary file for the fast path."""

    path: str
    lines: int = 0
    seen: int = 0  # lines read (numbered from 1), good or bad
    by_role: dict[str, int] = field(default_factory=dict)
    extra_rows: list[dict[str, Any]] = field(default_factory=list)  # e.g. dump_stats


def clean_file(rf: RecordFile, check, log: ProblemLog, tmpdir: str) -> CleanFile:
    """Read rf line by line with `check(obj) -> Verdict`; keep good lines in a temp file."""
    out = CleanFile(os.path.join(tmpdir, f"clean-{abs(hash(rf.path))}-{os.getpid()}.jsonl"))
    with open(out.path, "wb") as sink:
        try:
            _clean_lines(rf, check, log, sink, out)
        except StreamCut as exc:
            log.add(rf.path, out.seen + 1, "truncated", f"{CUT_SHORT} ({exc})")
    return out


def _clean_lines(rf: RecordFile, check, log: ProblemLog, sink, out: CleanFile) -> None:
    for number, text, has_nl in iter_lines(rf):
        out.seen = number
        if not text.strip():
            continue
        obj, verdict = decode(text, has_nl)
        if verdict is None and (b"\\ud" in text or b"\\uD" in text):
            obj, text = _lone_surrogates(obj, text, rf.path, number, log)
        verdict = verdict or check(obj)
        if verdict.kind:
            log.add(rf.path, number, verdict.kind, verdict.message, bad_line=verdict.record is None)
        if verdict.record is None:
            continue
        out.by_role[verdict.role] = out.by_role.get(verdict.role, 0) + 1
        if verdict.role == "dump_stats":
            out.extra_rows.append(verdict.record)
        if verdict.role not in ("op", "state"):
            continue
        sink.write(json.dumps(verdict.record).encode() if verdict.repaired else text)
        sink.write(b"\n")
        out.lines += 1


LONE_SURROGATE = (
    "a string holds a lone UTF-16 surrogate (a \\udXXX escape without its pair), which no "
    "UTF-8 reader accepts: replaced by U+FFFD"
)


def _lone_surrogates(obj: Any, text: bytes, path: str, number: int, log: ProblemLog):
    """(obj, text) with lone surrogates in strings replaced (reported once), else as
    they were: JSON decoders accept them, DuckDB's reader rejects the whole file."""
    fixed = _replace_surrogates(obj)
    if fixed == obj:
        return obj, text
    log.add(path, number, "bad_unicode", LONE_SURROGATE)
    return fixed, json.dumps(fixed).encode()


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        # pairs become their character; a surrogate alone becomes U+FFFD
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


def schema_verdict(obj: dict[str, Any]) -> Verdict | None:
    try:
        schema.check_schema_version(obj)
    except SchemaVersionError as exc:
        return Verdict(None, "newer_schema", exc.message)
    except RecordError as exc:
        return Verdict(None, "bad_schema_version", exc.message)
    return None
