"""Read one Nsight Systems SQLite export (`nsys export --type sqlite`) into a RankTrace.

nsys creates tables lazily and its columns change between versions, so every
table and column is looked up first (sqlite_master, PRAGMA table_info) and a
missing one only removes what it would have given:

* CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET: GPU work (ns, session-relative);
  kernel names through StringIds (demangledName, else shortName, else mangledName);
* CUPTI_ACTIVITY_KIND_RUNTIME: CUDA API calls, joined to GPU work by correlationId;
* NVTX_EVENTS: ranges (event types resolved through ENUM_NSYS_EVENT_TYPE when it
  exists) with text inline or through textId; ranges in the "NCCL" domain are the
  NCCL API calls (their JSON payload, when exported, gives communicator and bytes);
  step ranges (ProfilerStep#N, step_N, ...) define steps;
* TARGET_INFO_SESSION_START_TIME (absolute time base), TARGET_INFO_GPU (GPU name),
  TARGET_INFO_SYSTEM_ENV (host name).

Rows are fetched in batches, so memory follows the events kept, not the file.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

from rankwatch.errors import RecordError
from rankwatch.explain.events import (
    DEFAULT_INPUT_PATTERN,
    DEFAULT_STEP_PATTERN,
    CollMeta,
    EventBuilder,
    Kind,
    RankTrace,
    StepRange,
    family,
    no_cyclic_gc,
)
from rankwatch.explain.kineto import rank_from_filename

BATCH = 100_000
PUSH_POP, START_END, DOMAIN_CREATE = 59, 60, 75  # used when ENUM_NSYS_EVENT_TYPE is absent
COPY_KINDS = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 8: "Memcpy DtoD", 10: "Memcpy PtoP"}
NAME_COLUMNS = ("demangledName", "shortName", "mangledName", "name")


class _Db:
    """The tables and columns an export has, and a batched query helper."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            rows = self.con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except sqlite3.DatabaseError as exc:
            raise RecordError(f"not an SQLite database ({exc})", file=path) from None
        self.tables = {r[0] for r in rows}
        self._columns: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self.con.execute(f"PRAGMA table_info({table})").fetchall()
            self._columns[table] = {r[1] for r in rows}
        return self._columns[table]

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and set(columns) <= self.columns(table)

    def rows(self, sql: str) -> Iterator[tuple[Any, ...]]:
        cur = self.con.execute(sql)
        while batch := cur.fetchmany(BATCH):
            yield from batch

    def scalar(self, sql: str) -> Any:
        try:
            row = self.con.execute(sql).fetchone()
        except sqlite3.DatabaseError:
            return None
        return None if row is None else row[0]


def _col(db: _Db, table: str, name: str, default: str = "-1") -> str:
    return name if name in db.columns(table) else default


def _strings(db: _Db) -> dict[int, str]:
    if not db.has("StringIds", "id", "value"):
        return {}
    return dict(db.rows("SELECT id, value FROM StringIds"))


def _gpu_table(db: _Db, b: EventBuilder, table: str, kind: Kind, strings: dict[int, str]) -> None:
    if not db.has(table, "start", "end"):
        return
    cols = db.columns(table)
    if kind in (Kind.KERNEL,):
        name_col = next((c for c in NAME_COLUMNS if c in cols), None)
        name_sql = name_col or "-1"
    elif "copyKind" in cols:
        name_sql = "copyKind"
    else:
        name_sql = "-1"
    sql = (
        f"SELECT start, end, {_col(db, table, 'deviceId', '0')}, "
        f"{_col(db, table, 'streamId', '0')}, {_col(db, table, 'correlationId')}, {name_sql} "
        f"FROM {table}"
    )
    for start, end, device, stream, corr, name_val in db.rows(sql):
        if kind == Kind.KERNEL:
            name = (
                strings.get(name_val, str(name_val)) if isinstance(name_val, int) else str(name_val)
            )
            k = Kind.COMM_KERNEL if name[:4].lower() in ("nccl", "rccl") else Kind.KERNEL
        elif kind == Kind.MEMCPY:
            name, k = COPY_KINDS.get(name_val, "Memcpy"), kind
        else:
            name, k = "Memset", kind
        b.add(
            int(k),
            name,
            int(start),
            int(end),
            b.track_id(True, device, stream),
            -1 if corr is None else int(corr),
        )


def _split_tid(global_tid: int | None) -> tuple[int, int]:
    """nsys packs the PID at bits 24..47 of globalTid, the TID in the low 24 bits."""
    g = int(global_tid or 0)
    return (g >> 24) & 0xFFFFFF, g & 0xFFFFFF


def _runtime(db: _Db, b: EventBuilder, strings: dict[int, str]) -> None:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not db.has(table, "start", "end"):
        return
    sql = (
        f"SELECT start, end, {_col(db, table, 'globalTid', '0')}, "
        f"{_col(db, table, 'correlationId')}, {_col(db, table, 'nameId')} FROM {table}"
    )
    for start, end, gtid, corr, name_id in db.rows(sql):
        pid, tid = _split_tid(gtid)
        name = strings.get(name_id, "cuda API")
        b.add(
            int(Kind.RUNTIME),
            name,
            int(start),
            int(end),
            b.track_id(False, pid, tid),
            -1 if corr is None else int(corr),
        )


def _event_types(db: _Db) -> tuple[set[int], int]:
    """NVTX range event types and the domain-create type, by name where the export says."""
    if not db.has("ENUM_NSYS_EVENT_TYPE", "id", "name"):
        return {PUSH_POP, START_END}, DOMAIN_CREATE
    rows = db.con.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE").fetchall()
    ranges = {int(i) for i, n in rows if n in ("NvtxPushPopRange", "NvtxStartEndRange")}
    create = next((int(i) for i, n in rows if n == "NvtxDomainCreate"), DOMAIN_CREATE)
    return ranges or {PUSH_POP, START_END}, create


def _nvtx_sql(db: _Db) -> str:
    cols = db.columns("NVTX_EVENTS")
    text = "text" if "text" in cols else "NULL"
    if "textId" in cols and "StringIds" in db.tables:
        text = f"COALESCE({text}, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    payload = "jsonText" if "jsonText" in cols else "NULL"
    if "jsonTextId" in cols and "StringIds" in db.tables:
        payload = f"COALESCE({payload}, (SELECT value FROM StringIds s WHERE s.id = n.jsonTextId))"
    return (
        f"SELECT start, {_col(db, 'NVTX_EVENTS', 'end', 'NULL')}, eventType, {text}, "
        f"{_col(db, 'NVTX_EVENTS', 'globalTid', '0')}, {_col(db, 'NVTX_EVENTS', 'domainId', '0')},"
        f" {payload} FROM NVTX_EVENTS n"
    )


def _nccl_meta(name: str, payload: str | None) -> CollMeta:
    """An NCCL API range: function from the name (ncclAllReduce), communicator and
    bytes from the payload when the export decoded it."""
    func = name[4:] if name.lower().startswith("nccl") else name
    meta = CollMeta(name=func.lower(), family=family(func), source="nvtx")
    try:
        data = json.loads(payload) if payload else {}
    except ValueError:
        data = {}
    if isinstance(data, dict):
        for key, value in data.items():
            low = key.lower()
            if "communicator" in low:
                meta.pg = str(value)
            elif "size" in low and "byte" in low:
                meta.size_bytes = int(value)
            elif low.startswith("peer"):
                meta.peer = int(value)
    return meta


class _Nvtx:
    def __init__(self, step_pattern: str, input_pattern: str) -> None:
        self.step_re = re.compile(step_pattern, re.I)
        self.input_re = re.compile(input_pattern)


def _nvtx(db: _Db, b: EventBuilder, pats: _Nvtx) -> None:
    if not db.has("NVTX_EVENTS", "start", "eventType"):
        return
    ranges, create = _event_types(db)
    domains: dict[int, str] = {}
    for start, end, etype, text, gtid, domain, payload in db.rows(_nvtx_sql(db)):
        if etype == create:
            domains[int(domain or 0)] = str(text)
            continue
        if etype not in ranges or end is None or text is None:
            continue
        pid, tid = _split_tid(gtid)
        track = b.track_id(False, pid, tid)
        start, end, name = int(start), int(end), str(text)
        if domains.get(int(domain or 0)) == "NCCL":
            b.add(int(Kind.COMM_CPU), name, start, end, track, meta=_nccl_meta(name, payload))
            continue
        m = pats.step_re.match(name)
        if m:
            b.steps.append(StepRange(int(m.group(1)), start, end, track, name))
        elif pats.input_re.search(name):
            b.add(int(Kind.INPUT), name, start, end, track)
        else:
            b.add(int(Kind.ANNOTATION), name, start, end, track)


def _info(db: _Db) -> dict[str, Any]:
    base = None
    if db.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        base = db.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    gpu = (
        db.scalar("SELECT name FROM TARGET_INFO_GPU") if db.has("TARGET_INFO_GPU", "name") else None
    )
    host = None
    if db.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
        host = db.scalar("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
    return {"base": None if base is None else int(base), "gpu": gpu, "host": host}


def read_nsys(
    path: str | os.PathLike[str],
    *,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    input_pattern: str = DEFAULT_INPUT_PATTERN,
) -> RankTrace:
    """Read one rank's Nsight Systems SQLite export (see module doc)."""
    name = os.fspath(path)
    db = _Db(name)
    with no_cyclic_gc():
        return _read(db, name, step_pattern, input_pattern)


def _read(db: _Db, name: str, step_pattern: str, input_pattern: str) -> RankTrace:
    try:
        if not ({"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"} & db.tables):
            raise RecordError(
                "no CUPTI_ACTIVITY_KIND_KERNEL or NVTX_EVENTS table: not an Nsight Systems "
                "export with CUDA or NVTX tracing",
                file=name,
            )
        b = EventBuilder()
        strings = _strings(db)
        _gpu_table(db, b, "CUPTI_ACTIVITY_KIND_KERNEL", Kind.KERNEL, strings)
        _gpu_table(db, b, "CUPTI_ACTIVITY_KIND_MEMCPY", Kind.MEMCPY, strings)
        _gpu_table(db, b, "CUPTI_ACTIVITY_KIND_MEMSET", Kind.MEMSET, strings)
        _runtime(db, b, strings)
        _nvtx(db, b, _Nvtx(step_pattern, input_pattern))
        info = _info(db)
    except sqlite3.DatabaseError as exc:
        raise RecordError(f"damaged SQLite export ({exc})", file=name) from None
    finally:
        db.con.close()
    rank = rank_from_filename(name)
    schema = {
        "time_base": "session start (TARGET_INFO_SESSION_START_TIME)"
        if info["base"] is not None
        else "session-relative (no TARGET_INFO_SESSION_START_TIME)",
        "tables": sorted(t for t in db.tables if t.startswith(("CUPTI", "NVTX", "TARGET"))),
    }
    return b.build(
        info["base"] or 0,
        path=name,
        fmt="nsys",
        rank=rank,
        rank_source="file name" if rank is not None else "unknown",
        host=info["host"],
        world_size=None,
        gpu_name=info["gpu"],
        schema=schema,
    )
