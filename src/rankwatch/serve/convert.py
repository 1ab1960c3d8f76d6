"""Lines in, the store's tables out: the live path reads records exactly as
`rankwatch analyze` does.

Each batch of lines is written to private temporary files, one op file and one
state file per source, and loaded with the store's own readers
(rankwatch.store.load) into a DuckDB connection holding the store's tables
(rankwatch.store.tables). So a field means the same live and offline, and the
batch tables feed the detectors through the same SQL as offline analysis
(rankwatch.detect.source). Lines DuckDB cannot decode, lines that are not
records, records missing a key field and records of a newer schema are
counted per source and dropped, as ingest drops them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rankwatch import nativelib, schema
from rankwatch.serve.intake import Chunk, Source
from rankwatch.store import load, tables
from rankwatch.store.engine import EngineSettings, configure

STATE_TABLES = ("comms", "progress", "clock", "stats")
LOADER_MEMORY = "512MB"  # DuckDB's bound for one batch (spills beyond)
SUFFIX = {"ops": ".log", "state": ".rwstate.jsonl"}
BATCH_TABLES = ("ops", *STATE_TABLES)
_OP_KEYS = " OR ".join(f'"{c}" IS NULL' for c in tables.OP_KEY_COLUMNS)
_BAD_OPS = (
    f"kind IS NULL OR kind NOT IN ('coll', 'p2p') OR {_OP_KEYS} OR (kind = 'coll' AND seq IS NULL) "
    f"OR schema_version > {schema.SCHEMA_VERSION}"
)


@dataclass
class Rejected:
    """Lines of one source dropped in one batch, by reason."""

    source: Source
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class Batch:
    """What loading one batch of lines gave: lines dropped per source, rows per table."""

    rejected: list[Rejected]
    records: dict[str, int]


def _sql_case(column: str, mapping: dict[str, str]) -> str:
    """SQL mapping a column of temporary file names to the sources' names."""
    whens = " ".join(f"WHEN {load.sql_str(k)} THEN {load.sql_str(v)}" for k, v in mapping.items())
    return f"(CASE {column} {whens} ELSE {column} END)" if mapping else column


class BatchLoader:
    """One DuckDB connection reused for every batch (see module doc)."""

    def __init__(self, settings: EngineSettings | None = None) -> None:
        import duckdb

        self.con = duckdb.connect()
        base = EngineSettings.from_env()
        configure(
            self.con, settings or EngineSettings(LOADER_MEMORY, base.spill_parent, base.threads)
        )
        tables.create_all(self.con)
        self.tmp = tempfile.mkdtemp(prefix="rankwatch-monitor-", dir=_fast_tmp())
        self._n = 0
        self.native = _native_available()
        self.counts: dict[str, int] = {}  # rows per table of the last batch

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def load(self, chunks: list[Chunk]) -> Batch:
        """Load a batch into the connection's tables (replacing the last batch).

        Fast path: every source's lines in one file per kind (DuckDB's reader costs about
        10 ms per file). Only when some line is bad are the lines loaded again one file
        per source, so that each rejected line is counted against the source it came from."""
        for t in BATCH_TABLES:
            self.con.execute(f"DELETE FROM {t}")
        by_source = _group(chunks)
        rejected = {key: Rejected(src) for key, (src, _) in by_source.items()}
        n_ops = sum(c.lines.n_ops for c in chunks)
        n_state = sum(c.lines.n_state for c in chunks)
        if n_ops and not self._fast(chunks, "ops", n_ops):
            self.con.execute("DELETE FROM ops")
            self._per_source("ops", by_source, rejected)
        if n_state and not self._fast(chunks, "state", n_state):
            self._per_source("state", by_source, rejected)
        self.counts = {t: self._count(t) for t in BATCH_TABLES}
        return Batch([r for r in rejected.values() if r.counts], dict(self.counts))

    def _fast(self, chunks: list[Chunk], kind: str, lines: int) -> bool:
        """Every source's lines of one kind in one file; True when all were good."""
        path = self._write_one([getattr(c.lines, kind) for c in chunks], kind)
        try:
            if kind == "ops":
                if not self._load_native([path]):
                    return self._plain_source("ops", ".log")
                load.load_ops(self.con, [path], lenient=True, source="filename", lean=True)
                c = load.op_file_stats(self.con).get(path, load.OpFileCounts())
                return c.clean and not c.inspector and c.ops == lines
            good, bad = load.stage_state(self.con, [path], lenient=True).get(path, (0, 0))
            if bad or good != lines:
                self.con.execute("DROP TABLE raw_state")
                return False
            load.distribute_state(self.con, [])
            return self._plain_source("state", ".rwstate.jsonl")
        finally:
            os.unlink(path)

    def _plain_source(self, kind: str, suffix: str) -> bool:
        """Name the rows' source as the plugin names its files: <host>-pid<pid><suffix>."""
        names = f"host || '-pid' || CAST(pid AS VARCHAR) || '{suffix}'"
        for t in ("ops",) if kind == "ops" else STATE_TABLES:
            self.con.execute(f"UPDATE {t} SET source_file = {names}")
        return True

    def _per_source(self, kind: str, by_source, rejected: dict[str, Rejected]) -> None:  # noqa: ANN001
        files = self._write(by_source, kind)
        try:
            if kind == "ops":
                self._load_ops(files, rejected)
            else:
                self._load_state(files, rejected)
        finally:
            for path in files:
                os.unlink(path)

    def processes(self) -> list[tuple[str, int, str | None]]:
        """(host, pid, job_id) of the batch's op and comm records."""
        return self.con.execute(
            "SELECT DISTINCT host, pid, job_id FROM ops UNION "
            "SELECT DISTINCT host, pid, job_id FROM comms"
        ).fetchall()

    def by_job(self, job_of: dict[tuple[str, int], str]) -> dict[str, dict[str, pa.Table]]:
        """Per job: the batch's rows of its processes, per table (Arrow)."""
        jobs = sorted(set(job_of.values()))
        present = [t for t in BATCH_TABLES if self.counts.get(t)]
        if len(jobs) == 1 and self._all_placed(job_of, present):  # the usual case: one job
            return {jobs[0]: {t: arrow_table(self.con.sql(f"SELECT * FROM {t}")) for t in present}}
        hosts, pids = [h for h, _ in job_of], [p for _, p in job_of]
        mapping = pa.table(
            {
                "host": pa.array(hosts, pa.string()),
                "pid": pa.array(pids, pa.int64()),
                "job": pa.array(list(job_of.values()), pa.string()),
            }
        )
        self.con.register("rw_batch_jobs", mapping)
        out: dict[str, dict[str, pa.Table]] = {}
        for job in jobs:
            for t in present:
                rel = self.con.sql(
                    f"SELECT t.* FROM {t} t JOIN rw_batch_jobs j USING (host, pid) "
                    "WHERE j.job = $job",
                    params={"job": job},
                )
                table = arrow_table(rel)
                if table.num_rows:
                    out.setdefault(job, {})[t] = table
        self.con.unregister("rw_batch_jobs")
        return out

    def _all_placed(self, job_of: dict[tuple[str, int], str], present: list[str]) -> bool:
        """Whether every process in the batch has a job (else some rows stay out)."""
        if not present:
            return True
        rows = self.con.execute(
            " UNION ".join(f"SELECT DISTINCT host, pid FROM {t}" for t in present)
        ).fetchall()
        return all((h, p) in job_of for h, p in rows)

    def _count(self, table: str) -> int:
        return int(self.con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])

    # ------------------------------------------------------------------ internals
    def _write_one(self, parts: list[bytes], kind: str) -> str:
        self._n += 1
        path = os.path.join(self.tmp, f"b{self._n}{SUFFIX[kind]}")
        with open(path, "wb") as f:
            f.writelines(p for p in parts if p)
        return path

    def _write(self, by_source: dict[str, tuple[Source, list[Chunk]]], kind: str) -> dict[str, str]:
        """One file per source (path -> source key)."""
        files: dict[str, str] = {}
        for key, (_, chunks) in by_source.items():
            parts = [getattr(c.lines, kind) for c in chunks]
            if any(parts):
                files[self._write_one(parts, kind)] = key
        return files

    def _load_native(self, paths: list[str]) -> list[str]:
        """Clean files through the store's native reader when it is built (about twice
        as fast); returns the files left for DuckDB's lenient reader, which counts each
        bad line by reason."""
        if not self.native:
            return paths
        from rankwatch.store import native
        from rankwatch.store.discover import RecordFile

        files = [RecordFile(p, "ops", "rankwatch", False, os.path.getsize(p)) for p in paths]
        try:
            outcomes = native.load_files(self.con, files, 1)
        except Exception:  # the native reader is an optimisation: fall back, never fail
            self.con.execute("DELETE FROM ops")
            self.native = False
            return paths
        bad = [p for p in paths if not outcomes[p].clean]
        load.delete_files(self.con, "ops", bad)
        return bad

    def _name_sources(self, table: str, files: dict[str, str], rejected: dict[str, Rejected]):
        names = {p: rejected[k].source.name for p, k in files.items()}
        self.con.execute(f"UPDATE {table} SET source_file = {_sql_case('source_file', names)}")

    def _load_ops(self, files: dict[str, str], rejected: dict[str, Rejected]) -> None:
        if not files:
            return
        paths = self._load_native(list(files))
        load.load_ops(self.con, paths, lenient=True, source="filename", lean=True)
        per_file = load.op_file_stats(self.con)
        mixed = [p for p in paths if per_file.get(p, load.OpFileCounts()).inspector]
        if mixed:  # Inspector records: their fields live elsewhere, read them in full
            load.delete_files(self.con, "ops", mixed)
            load.load_ops(self.con, mixed, lenient=True, source="filename")
            per_file = load.op_file_stats(self.con)
        for path, c in per_file.items():
            counts = rejected[files[path]].counts
            for reason, n in (
                ("malformed", c.undecodable),
                ("not_a_record", c.other),
                ("missing_key_field", c.null_keys),
                ("newer_schema", c.newer),
            ):
                if n:
                    counts[reason] = counts.get(reason, 0) + n
        self.con.execute(f"DELETE FROM ops WHERE {_BAD_OPS}")
        self._name_sources("ops", files, rejected)

    def _load_state(self, files: dict[str, str], rejected: dict[str, Rejected]) -> None:
        if not files:
            return
        lines = {p: _count_lines(p) for p in files}
        per_file = load.stage_state(self.con, list(files), lenient=True, source="filename")
        for path, (good, bad) in per_file.items():
            counts = rejected[files[path]].counts
            undecodable = lines[path] - good - bad
            if bad:
                counts["bad_state_record"] = counts.get("bad_state_record", 0) + bad
            if undecodable > 0:
                counts["malformed"] = counts.get("malformed", 0) + undecodable
        self._name_sources("raw_state", files, rejected)
        load.distribute_state(self.con, [])


def _group(chunks: list[Chunk]) -> dict[str, tuple[Source, list[Chunk]]]:
    out: dict[str, tuple[Source, list[Chunk]]] = {}
    grouped: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        grouped[c.source.key].append(c)
        out.setdefault(c.source.key, (c.source, grouped[c.source.key]))
    return out


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _native_available() -> bool:
    """The store's native op-record reader, unless RANKWATCH_NATIVE=0 turns it off."""
    if nativelib.disabled():
        return False
    try:
        from rankwatch.store import native

        return bool(native.available())
    except Exception:  # an old or unbuilt store: the DuckDB reader does it all
        return False


def _fast_tmp() -> str | None:
    """A memory-backed directory for the short-lived batch files when there is one."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def arrow_table(result: Any) -> pa.Table:
    """A query result as an Arrow table, across DuckDB versions (2 renamed the call)."""
    for name in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        fetch = getattr(result, name, None)
        if fetch is not None:
            table = fetch()
            return table.read_all() if hasattr(table, "read_all") else table
    raise TypeError(f"cannot read {type(result).__name__} as Arrow")
