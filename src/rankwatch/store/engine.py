"""How DuckDB runs for ingest and analysis: a memory bound and a spill directory.

DuckDB's buffer manager keeps tables (in-memory ones included) and intermediate
results (sorts, joins, windows) under `memory_limit` and writes the rest to a
private spill directory, so peak memory stays flat as jobs grow and only the
spill grows, linearly with the records. Measured with bench/analyze_bench.py
(64 ranks, 1.2 KB records, default 1 GB limit): peak RSS 0.85 GB at 1 M op
records, 1.1 GB at 3 M and 1.13 GB at 10 M (12 GB of JSON lines), where DuckDB's
own default (80 % of the machine's memory) reached 0.85, 2.2 and 6.8 GB. The
spill directory is made by DuckDB on first use, under the system temporary
directory, and removed when the connection closes or the process exits.

Settings, read once from the environment by `EngineSettings.from_env()`:

  RANKWATCH_MEMORY_LIMIT  DuckDB memory limit, e.g. `1GB` (default), `4GB`, or `none`
                          for DuckDB's own default (80 % of the machine's memory)
  RANKWATCH_SPILL_DIR     where spill directories go (default: the system temp dir)
  RANKWATCH_THREADS       DuckDB worker threads (default: DuckDB's, one per core)
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rankwatch.errors import ConfigError

DEFAULT_MEMORY_LIMIT = "1GB"
_counter = itertools.count()


@dataclass(frozen=True)
class EngineSettings:
    memory_limit: str | None = DEFAULT_MEMORY_LIMIT  # None: DuckDB's default
    spill_parent: str | None = None  # None: tempfile.gettempdir()
    threads: int | None = None  # None: DuckDB's default

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EngineSettings:
        env = os.environ if env is None else env
        limit = env.get("RANKWATCH_MEMORY_LIMIT", "").strip() or DEFAULT_MEMORY_LIMIT
        threads = env.get("RANKWATCH_THREADS", "").strip()
        if threads and (not threads.isdigit() or int(threads) < 1):
            raise ConfigError(f"RANKWATCH_THREADS={threads!r}: expected a positive integer")
        return cls(
            memory_limit=None if limit.lower() == "none" else limit,
            spill_parent=env.get("RANKWATCH_SPILL_DIR") or None,
            threads=int(threads) if threads else None,
        )


def spill_dir(settings: EngineSettings) -> str:
    """A fresh, not yet created spill directory path, removed at exit if DuckDB left it."""
    parent = settings.spill_parent or tempfile.gettempdir()
    path = os.path.join(parent, f"rankwatch-spill-{os.getpid()}-{next(_counter)}")
    atexit.register(shutil.rmtree, path, True)
    return path


def configure(con: Any, settings: EngineSettings) -> str:
    """Apply settings to a fresh connection; returns its spill directory."""
    import duckdb

    path = spill_dir(settings)
    statements = [f"SET temp_directory = '{path.replace(chr(39), chr(39) * 2)}'"]
    if settings.memory_limit is not None:
        statements.append(f"SET memory_limit = '{settings.memory_limit.replace(chr(39), '')}'")
    if settings.threads is not None:
        statements.append(f"SET threads = {int(settings.threads)}")
    for sql in statements:
        try:
            con.execute(sql)
        except duckdb.Error as exc:
            raise ConfigError(f"{sql}: {exc} (check RANKWATCH_* settings)") from exc
    return path
