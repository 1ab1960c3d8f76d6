"""Write simulated events (synth.Simulation) as Nsight Systems SQLite exports, one
per rank (as `nsys profile -o rank%q{RANK}` then `nsys export --type sqlite` makes).

Tables and columns follow the nsys export schema: names are ids into StringIds,
times are nanoseconds from the session start (TARGET_INFO_SESSION_START_TIME),
NVTX ranges live in NVTX_EVENTS with an eventType from ENUM_NSYS_EVENT_TYPE, and
NCCL's own ranges sit in the "NCCL" domain. Two variants: "nsys" (recent: textId,
JSON payloads, NCCL ranges, memcpy table) and "nsys_old" (text inline, no enum
table, no NCCL ranges, no memcpy or session-start tables), which the reader must
also handle.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from rankwatch.explain.synth import SimEvent, SynthConfig

PUSH_POP = 59
START_END = 60
DOMAIN_CREATE = 75
NCCL_DOMAIN = 1

_KERNEL_COLUMNS = (
    "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
    "contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
    "globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, "
    "mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER, "
    "registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, "
    "gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, "
    "blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, "
    "dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL, "
    "localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, "
    "sharedMemoryExecuted INTEGER, graphNodeId INTEGER"
)
_RUNTIME_COLUMNS = (
    "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
    "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
    "returnValue INTEGER NOT NULL, callchainId INTEGER"
)
_MEMCPY_COLUMNS = (
    "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
    "contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
    "globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, "
    "deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, "
    "srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, "
    "migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER"
)
_NVTX_NEW = (
    "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
    "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
    "textId INTEGER REFERENCES StringIds(id), domainId INTEGER, uint64Value INTEGER, "
    "int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
    "floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT"
)
_NVTX_OLD = (
    "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
    "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
    "domainId INTEGER"
)
_NCCL_API = {
    "allreduce": "ncclAllReduce",
    "all_gather_into_tensor": "ncclAllGather",
    "reduce_scatter_tensor": "ncclReduceScatter",
}


class NsysWriter:
    """Builds one rank's SQLite export; events arrive step by step."""

    def __init__(self, out_dir: Path, cfg: SynthConfig, rank: int, variant: str) -> None:
        self.cfg = cfg
        self.rank = rank
        self.new = variant == "nsys"
        self.path = out_dir / f"rank{rank}.sqlite"
        self.path.unlink(missing_ok=True)
        self.db = sqlite3.connect(self.path)
        self.pid = 5000 + rank
        self.offset = cfg.offset_ns(rank)
        self.session = None  # session start on this rank's clock, set by the first event
        self.strings: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {"k": [], "r": [], "m": [], "n": []}
        self._schema()

    def _schema(self) -> None:
        db = self.db
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({_KERNEL_COLUMNS})")
        db.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME ({_RUNTIME_COLUMNS})")
        db.execute(f"CREATE TABLE NVTX_EVENTS ({_NVTX_NEW if self.new else _NVTX_OLD})")
        db.execute(
            "CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT NOT NULL, "
            "busLocation TEXT, totalMemory INTEGER, smCount INTEGER)"
        )
        db.execute(
            "INSERT INTO TARGET_INFO_GPU VALUES (?, ?, ?, ?, ?)",
            (self.rank % 8, self.cfg.gpu_name, f"0000:{self.rank:02x}:00.0", 150754820096, 132),
        )
        db.execute(
            "CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT "
            "NOT NULL, name TEXT NOT NULL, nameEnum INTEGER NOT NULL, value TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, '', 'Hostname', 1, ?)",
            (self.cfg.host_of(self.rank),),
        )
        if not self.new:
            return
        db.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY ({_MEMCPY_COLUMNS})")
        db.execute(
            "CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, "
            "description TEXT)"
        )
        db.executemany(
            "INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
            [
                (34, "NvtxMark", "NVTX mark"),
                (59, "NvtxPushPopRange", "NVTX push-pop range"),
                (60, "NvtxStartEndRange", "NVTX start-end range"),
                (75, "NvtxDomainCreate", "NVTX domain create"),
                (76, "NvtxDomainDestroy", "NVTX domain destroy"),
            ],
        )
        db.execute(
            "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, "
            "utcTime TEXT, localTime TEXT)"
        )

    def _sid(self, text: str) -> int:
        got = self.strings.get(text)
        if got is None:
            got = self.strings[text] = len(self.strings) + 1
        return got

    def _t(self, true_ns: int) -> int:
        return true_ns + self.offset - self.session

    def _tid(self, lane: int) -> int:
        return (1 << 48) | (self.pid << 24) | (self.pid + lane)

    def _start_session(self, first: int) -> None:
        self.session = first + self.offset - 50_000_000
        if self.new:
            self.db.execute(
                "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (self.session,)
            )
            self.rows["n"].append(
                (
                    0,
                    0,
                    DOMAIN_CREATE,
                    None,
                    None,
                    None,
                    "NCCL",
                    self._tid(1),
                    None,
                    None,
                    NCCL_DOMAIN,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                )
            )

    def _nvtx(self, ev: SimEvent, domain: int = 0, payload: dict | None = None) -> None:
        if self.new:
            self.rows["n"].append(
                (
                    self._t(ev.start),
                    self._t(ev.end),
                    PUSH_POP,
                    None,
                    None,
                    None,
                    None,
                    self._tid(ev.lane),
                    None,
                    self._sid(ev.name),
                    domain,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None if payload is None else json.dumps(payload),
                    None,
                )
            )
        else:
            self.rows["n"].append(
                (
                    self._t(ev.start),
                    self._t(ev.end),
                    PUSH_POP,
                    None,
                    None,
                    None,
                    ev.name,
                    self._tid(ev.lane),
                    None,
                    domain,
                )
            )

    def _kernel(self, ev: SimEvent) -> None:
        name = ev.name + (
            "(ncclDevKernelArgsStorage<4096ul>)" if ev.name.startswith("nccl") else ""
        )
        sid = self._sid(name)
        short = self._sid(name.split("(")[0].split("<")[0].replace("void ", ""))
        self.rows["k"].append(
            (
                self._t(ev.start),
                self._t(ev.end),
                self.rank % 8,
                1,
                ev.lane,
                ev.corr,
                (1 << 48) | (self.pid << 24),
                sid,
                short,
                sid,
                0,
                0,
                128,
                132,
                1,
                1,
                256,
                1,
                1,
                0,
                0,
                0,
                0,
                ev.corr,
                0,
                0,
            )
        )

    def _event(self, ev: SimEvent) -> None:
        cat = ev.cat
        if cat == "kernel":
            self._kernel(ev)
        elif cat == "memcpy" and self.new:
            kind = 1 if "HtoD" in ev.name else 2
            self.rows["m"].append(
                (
                    self._t(ev.start),
                    self._t(ev.end),
                    self.rank % 8,
                    1,
                    ev.lane,
                    ev.corr,
                    (1 << 48) | (self.pid << 24),
                    (ev.args or {}).get("bytes", 0),
                    kind,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0,
                )
            )
        elif cat == "runtime":
            name = ev.name + ("_v7000" if "Launch" in ev.name else "_v3020")
            self.rows["r"].append(
                (
                    self._t(ev.start),
                    self._t(ev.end),
                    1,
                    self._tid(ev.lane),
                    ev.corr,
                    self._sid(name),
                    0,
                    0,
                )
            )
        elif cat == "step":
            self._nvtx(
                SimEvent(cat, f"train_step_{ev.name.split('#')[1]}", ev.start, ev.end, ev.lane)
            )
        elif cat in ("annotation", "input"):
            self._nvtx(ev)
        elif cat == "nccl_range" and self.new:
            self._nvtx(ev, NCCL_DOMAIN, self._payload(ev.args or {}))

    def _payload(self, meta: dict[str, Any]) -> dict[str, Any]:
        size = int(meta.get("In msg nelems", 0)) * 2
        return {
            "NCCL communicator ID": 0x5EED0000 + 1,
            "Message size [bytes]": size,
            "Reduction operation": "Sum",
        }

    def write(self, events: list[SimEvent]) -> None:
        if self.session is None and events:
            self._start_session(min(e.start for e in events))
        for ev in events:
            self._event(ev)
        self._flush()

    def _flush(self) -> None:
        db, rows = self.db, self.rows
        inserts = {
            "k": "CUPTI_ACTIVITY_KIND_KERNEL",
            "r": "CUPTI_ACTIVITY_KIND_RUNTIME",
            "m": "CUPTI_ACTIVITY_KIND_MEMCPY",
            "n": "NVTX_EVENTS",
        }
        for key, table in inserts.items():
            if rows[key]:
                marks = ", ".join("?" * len(rows[key][0]))
                db.executemany(f"INSERT INTO {table} VALUES ({marks})", rows[key])
                rows[key] = []

    def close(self) -> Path:
        self._flush()
        self.db.executemany(
            "INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()]
        )
        self.db.commit()
        self.db.close()
        return self.path
