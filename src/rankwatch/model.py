"""The analysis model: a `Run` (records loaded into DuckDB, plus what is known
about the job) and a `Finding` (one conclusion a detector draws from a run).

Everything downstream of ingest (aligners, detectors, exporters) reads a Run and
produces tables or Findings; nothing here prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # duckdb is imported lazily so `rankwatch plugin-path` stays fast
    import duckdb

# Tables every Run has after ingest (see rankwatch.store.tables for columns).
BASE_TABLES: tuple[str, ...] = ("ops", "comms", "progress", "clock", "stats", "files", "problems")


@dataclass(frozen=True)
class Problem:
    """Something wrong found while reading records: where, what, how often."""

    file: str
    line: int | None
    kind: str  # malformed_json, truncated, wrong_type, bad_unicode, newer_schema, io, ...
    message: str
    repeats: int = 0  # further lines of the same kind in the same file, not listed one by one

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        more = f" (and {self.repeats} more line(s) like it)" if self.repeats else ""
        return f"{where}: {self.message}{more}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Run:
    """One analysed job: the DuckDB connection holding its tables, and metadata.

    `tables` maps logical names (ops, comms, ..., plus those aligners add such as
    collectives or host_clock) to the DuckDB table or view holding them.
    """

    con: duckdb.DuckDBPyConnection
    tables: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    store_path: str | None = None

    def table(self, name: str) -> str:
        """The DuckDB name of a logical table; KeyError naming what exists."""
        try:
            return self.tables[name]
        except KeyError:
            known = ", ".join(sorted(self.tables))
            raise KeyError(f"no table {name!r} in this run (have: {known})") from None

    def sql(self, query: str, params: list[Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Run SQL against the run's connection and return the relation."""
        return self.con.sql(query, params=params)

    def count(self, name: str) -> int:
        rows = self.con.execute(f"SELECT count(*) FROM {self.table(name)}").fetchall()
        return int(rows[0][0])


@dataclass(frozen=True)
class CommRef:
    """A communicator as findings name it."""

    id: str
    name: str | None = None


@dataclass(frozen=True)
class Since:
    """When a finding started: host time (reference clock) and op sequence number."""

    ns: int | None = None
    seq: int | None = None


@dataclass(frozen=True)
class Finding:
    """One conclusion about the job, with the evidence behind it.

    kind: e.g. straggler, hang, desync. cost_s: estimated job time lost (None when
    not estimated). confidence: 0..1. evidence: plain data (numbers, ids, small
    tables as lists of dicts) a reader can check the conclusion against.
    """

    kind: str
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    comm: CommRef | None = None
    since: Since | None = None
    cause: str | None = None
    cost_s: float | None = None
    confidence: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    # the rank's CUDA device, when its process holds several ranks (see align.ranks)
    device: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
