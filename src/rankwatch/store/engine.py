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

An in-memory store keeps its tables in an in-memory database that DuckDB
compresses at a checkpoint, and compact() checkpoints it once the tables take
half the memory limit (ingest calls it as records arrive): 10 M op records
appended to the table then take about 0.5 GB instead of 3.4 GB, so queries over
them run from memory instead of reading spilled blocks back (align at 10 M: 37
instead of 79 CPU seconds, for about 2 CPU seconds of compression per million
records). The op rows the native reader parses skip the table altogether
(rankwatch.store.held): the first ones are held as Arrow batches, up to
held_budget() (HELD_FRACTION of the memory limit, DuckDB's own limit lowered by
what they take, so the two together stay within RANKWATCH_MEMORY_LIMIT), and the
rest are written to uncompressed Arrow IPC files, which scans read back through
pyarrow (its batches in flight are outside that limit: see HELD_FRACTION and
release_arrow_memory); `ops` is then a view over them and the table (rows of
Inspector logs and of files the native reader did not take).

Settings, read once from the environment by `EngineSettings.from_env()`:

  RANKWATCH_MEMORY_LIMIT  DuckDB memory limit, e.g. `1GB` (default), `4GB`, or `none`
                          for DuckDB's own default (80 % of the machine's memory)
  RANKWATCH_SPILL_DIR     where spill directories go (default: the system temp dir)
  RANKWATCH_THREADS       DuckDB worker threads (default: DuckDB's, one per core); also
                          the native reader's parsing threads
  RANKWATCH_NATIVE        `0` turns the compiled helpers off where they are installed:
                          op records are read with DuckDB's JSON reader instead of the
                          native reader (rankwatch.store.native), collectives and host
                          clocks are aligned with SQL instead of the alignment's kernels
                          (rankwatch.align.kernels), and the detectors run their NumPy
                          forms instead of their kernels (rankwatch.detect.kernels); same
                          results (clock estimates to the rounding of sums), only slower

Besides that, the native reader keeps the collective ops' alignment columns
(rankwatch.store.captured: 57 bytes per collective op, about 0.57 GB at 10 M
records) until align has used them, and align's compiled passes hold about 48 MB
each (two at a time on two cores): at 10 M records peak RSS was 1.6 to 1.7 GB
with the default 1 GB limit (bench/RESULTS.md section 4).
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

from rankwatch import nativelib
from rankwatch.errors import ConfigError

DEFAULT_MEMORY_LIMIT = "1GB"
_counter = itertools.count()


@dataclass(frozen=True)
class EngineSettings:
    memory_limit: str | None = DEFAULT_MEMORY_LIMIT  # None: DuckDB's default
    spill_parent: str | None = None  # None: tempfile.gettempdir()
    threads: int | None = None  # None: DuckDB's default
    native: bool = True  # use the native op-record reader when it is installed
    # op rows held as Arrow (store.held); None: see held_budget; 0: all appended to the
    # table (as in a kept store, and under a tight limit)
    held_bytes: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EngineSettings:
        env = os.environ if env is None else env
        limit = env.get("RANKWATCH_MEMORY_LIMIT", "").strip() or DEFAULT_MEMORY_LIMIT
        threads = env.get("RANKWATCH_THREADS", "").strip()
        if threads and (not threads.isdigit() or int(threads) < 1):
            raise ConfigError(f"RANKWATCH_THREADS={threads!r}: expected a positive integer")
        native = env.get("RANKWATCH_NATIVE", "").strip().lower()
        if native not in ("", "0", "1", "no", "yes", "off", "on", "false", "true"):
            raise ConfigError(f"RANKWATCH_NATIVE={native!r}: expected 0 or 1")
        return cls(
            memory_limit=None if limit.lower() == "none" else limit,
            spill_parent=env.get("RANKWATCH_SPILL_DIR") or None,
            threads=int(threads) if threads else None,
            native=not nativelib.disabled(env),
        )

    def native_workers(self) -> int:
        """Parsing threads for the native reader; 0 when it is off or not installed."""
        from rankwatch.store import native

        if not self.native or not native.available():
            return 0
        return self.threads or os.cpu_count() or 1


def private_path(spill_parent: str | None, what: str) -> str:
    """A fresh, not yet created directory path of this process under spill_parent
    (default: the system temporary directory); the caller arranges its removal."""
    parent = spill_parent or tempfile.gettempdir()
    return os.path.join(parent, f"rankwatch-{what}-{os.getpid()}-{next(_counter)}")


def spill_dir(settings: EngineSettings) -> str:
    """A fresh, not yet created spill directory path, removed at exit if DuckDB left it."""
    path = private_path(settings.spill_parent, "spill")
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


# ------------------------------------------------------------ compression

STORE_CATALOG = "rankwatch_store"
COMPACT_FRACTION = 0.5  # compress once tables take this share of the memory limit
DUCKDB_FLOOR_BYTES = 384 << 20  # the least DuckDB is left when op rows are held
# Share of the memory limit the held op rows may take. Less than COMPACT_FRACTION:
# a scan of the rows spilled past it reads them through pyarrow, which has about
# 0.35 GB of batches in flight at 10 M records outside that limit (peak RSS at 10 M:
# 1.72 GB with 0.35, 1.85 to 2.05 GB with 0.5; a million records, 0.28 GB of held
# rows, still fit whole under the default 1 GB limit).
HELD_FRACTION = 0.35
_UNITS = {"bytes": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}  # fmt: skip


def use_compressed_memory(con: Any) -> bool:
    """Keep the tables of an in-memory store in an in-memory database that DuckDB
    compresses at each checkpoint (see compact()); False where this DuckDB cannot."""
    import duckdb

    try:
        con.execute(f"ATTACH ':memory:' AS {STORE_CATALOG} (COMPRESS)")
        con.execute(f"USE {STORE_CATALOG}")
    except duckdb.Error:
        return False
    # Only compact() compresses: DuckDB's automatic checkpoint (every 16 MiB of
    # changes) would otherwise compress the whole ops table at whichever later
    # statement crosses it, e.g. 1 s inside align at 1 M records, where the tables
    # fit in memory uncompressed anyway.
    con.execute("SET checkpoint_threshold = '1TB'")
    return True


def _bytes(setting: str) -> float | None:
    number, _, unit = setting.strip().partition(" ")
    try:
        return float(number) * _UNITS[unit.strip().lower() or "bytes"]
    except (ValueError, KeyError):
        return None


def limit_bytes(con: Any) -> float | None:
    """DuckDB's memory limit in bytes (None where it cannot be read)."""
    return _bytes(str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]))


def held_budget(con: Any, settings: EngineSettings) -> int:
    """Bytes of op rows an in-memory store may hold as Arrow batches (store.held):
    settings.held_bytes, else HELD_FRACTION of the memory limit, leaving DuckDB at
    least DUCKDB_FLOOR_BYTES (under a tight limit nothing is held, and the op rows
    are appended to the table instead of going to IPC files)."""
    if settings.held_bytes is not None:
        return settings.held_bytes
    limit = limit_bytes(con)
    if limit is None:
        return 0
    return int(max(0.0, min(HELD_FRACTION * limit, limit - DUCKDB_FLOOR_BYTES)))


def compact(con: Any) -> bool:
    """Compress the store's tables (a checkpoint of the compressed in-memory
    database) once they take COMPACT_FRACTION of the memory limit: uncompressed,
    a large job's ops would spill to disk and every query over them would read
    them back; compressed, about a ninth of that stays in memory. Costs about
    2 CPU seconds per million op records, so small jobs are left as they are.
    Returns whether it compressed."""
    rows = con.execute(
        f"SELECT (SELECT count(*) FROM duckdb_databases() WHERE database_name = "
        f"'{STORE_CATALOG}'), (SELECT coalesce(sum(memory_usage_bytes + "
        f"temporary_storage_bytes), 0) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'), "
        f"current_setting('memory_limit')"
    ).fetchall()[0]
    attached, used, limit = int(rows[0]), float(rows[1]), _bytes(str(rows[2]))
    if not attached or limit is None or used < COMPACT_FRACTION * limit:
        return False
    con.execute(f"CHECKPOINT {STORE_CATALOG}")
    return True


def release_arrow_memory() -> None:
    """Hand the memory pyarrow's allocator keeps after a scan back to the system.

    A scan of the op rows spilled to IPC files (store.held) reads them through
    pyarrow, which allocates a few hundred MB of batches in flight (454 MB at 10 M
    records) from its pool; the pool keeps them after the query ends, and the
    alignment passes that follow then stack their own memory on top (peak RSS
    2.27 GB against 1.84 GB with this called after the first full scan of ops).
    Cheap when there is nothing to release; a no-op where pyarrow is not loaded."""
    import sys

    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
