"""Record files in, DuckDB tables out.

`ingest(paths)` finds rankwatch and NCCL/RCCL Inspector record files under
paths and loads them into the tables described in rankwatch.store.tables:
ops, comms, progress, clock, stats, plus files and problems (what could not
be read, each bad line once with its file and line number). DuckDB runs
memory-bounded, spilling to a private temporary directory (rankwatch.store.engine).
"""

from __future__ import annotations

from rankwatch.store.engine import EngineSettings
from rankwatch.store.store import Store, ingest

__all__ = ["EngineSettings", "Store", "ingest"]
