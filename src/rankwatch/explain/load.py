"""Find the per-rank trace files, read them (in parallel worker processes when there
are several), and decide which rank each file is.

One unreadable file never stops the others: its error becomes a Problem naming
the file (and line, where the format has lines) and that rank is left out.
"""

from __future__ import annotations

import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rankwatch.errors import RecordError
from rankwatch.explain.events import DEFAULT_INPUT_PATTERN, DEFAULT_STEP_PATTERN, RankTrace
from rankwatch.model import Problem

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class ReadOptions:
    step_pattern: str = DEFAULT_STEP_PATTERN
    input_pattern: str = DEFAULT_INPUT_PATTERN


@dataclass
class Loaded:
    traces: list[RankTrace] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def find_trace_files(paths: list[str | os.PathLike[str]]) -> list[str]:
    """Files given, plus trace files found recursively under directories given."""
    found: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(
                str(f) for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES)
            )
        else:
            found.append(str(p))
    return list(dict.fromkeys(found))


def trace_format(path: str) -> str:
    """kineto or nsys, from the file's first bytes (names lie; magic numbers do not)."""
    if path.endswith(".nsys-rep"):
        raise RecordError(
            "an Nsight Systems report; export it first: nsys export --type sqlite " + path,
            file=path,
        )
    with open(path, "rb") as f:
        head = f.read(16)
    return "nsys" if head == SQLITE_MAGIC else "kineto"


def read_trace(path: str, opts: ReadOptions) -> RankTrace:
    """Read one file in whichever format it is."""
    try:
        fmt = trace_format(path)
    except OSError as exc:
        raise RecordError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if fmt == "nsys":
        from rankwatch.explain.nsys import read_nsys

        return read_nsys(path, step_pattern=opts.step_pattern, input_pattern=opts.input_pattern)
    from rankwatch.explain.kineto import read_kineto

    return read_kineto(path, step_pattern=opts.step_pattern, input_pattern=opts.input_pattern)


def _read_safely(path: str, opts: ReadOptions) -> RankTrace | Problem:
    """A RankTrace, or the Problem that kept this file out (never raises)."""
    try:
        return read_trace(path, opts)
    except RecordError as exc:
        kind = "truncated" if "truncated" in exc.message or "ends" in exc.message else "unreadable"
        field_ = f"{exc.field}: " if exc.field else ""
        return Problem(path, exc.line, kind, f"{field_}{exc.message}; this rank is left out")
    except MemoryError:
        return Problem(path, None, "memory", "ran out of memory reading it; this rank is left out")
    except Exception as exc:  # noqa: BLE001 - one rank's surprise must not end the analysis
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return Problem(
            path,
            None,
            "internal",
            f"could not be read ({type(exc).__name__}: {exc} at {Path(where.filename).name}:"
            f"{where.lineno}); this rank is left out",
        )


def _assign_ranks(traces: list[RankTrace], problems: list[Problem]) -> list[RankTrace]:
    """Ranks from the files where they say; duplicates dropped (kept: the first file);
    files that do not say get the lowest free ranks in file order."""
    kept: dict[int, RankTrace] = {}
    unknown: list[RankTrace] = []
    for t in traces:
        if t.rank is None:
            unknown.append(t)
        elif t.rank in kept:
            problems.append(
                Problem(
                    t.path,
                    None,
                    "duplicate_rank",
                    f"rank {t.rank} again (first: {kept[t.rank].path}); this file is left out",
                )
            )
        else:
            kept[t.rank] = t
    free = (r for r in range(len(traces) + len(kept) + 1) if r not in kept)
    for t in unknown:
        t.rank = next(free)
        t.rank_source = "order of files"
        problems.append(
            Problem(
                t.path,
                None,
                "rank_guessed",
                f"the file does not say its rank; taken as rank {t.rank} (order of files)",
            )
        )
        kept[t.rank] = t
    return [kept[r] for r in sorted(kept)]


def load(
    paths: list[str | os.PathLike[str]], opts: ReadOptions | None = None, jobs: int = 0
) -> Loaded:
    """Read every trace under `paths` with `jobs` worker processes (0: one per CPU)."""
    opts = opts or ReadOptions()
    files = find_trace_files(paths)
    out = Loaded(files=files)
    jobs = min(len(files), jobs or os.cpu_count() or 1)
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_read_safely, files, [opts] * len(files)))
    else:
        results = [_read_safely(f, opts) for f in files]
    traces = []
    for r in results:
        if isinstance(r, Problem):
            out.problems.append(r)
        else:
            traces.append(r)
            out.problems += r.problems
    out.traces = _assign_ranks(traces, out.problems)
    return out
