"""The record schema: every field the plugin writes, as Python data.

This module is the Python twin of docs/record-format.md (tests/test_schema_sync.py
keeps the two equal) and the one place analysis code learns field names, types and
units from. It also validates records: readers accept older schema versions and
reject newer ones with a message naming both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Literal

from rankwatch.errors import RecordError, SchemaVersionError

SCHEMA_VERSION = 1

FieldType = Literal["int", "float", "string", "bool", "object", "array"]
FIELD_TYPES: tuple[str, ...] = ("int", "float", "string", "bool", "object", "array")


@dataclass(frozen=True)
class Field:
    """One record field: JSON type, unit ("" when unitless) and meaning."""

    name: str
    type: FieldType
    unit: str
    meaning: str
    nullable: bool = False
    since: int = 1  # schema version that added the field

    def __post_init__(self) -> None:
        if self.type not in FIELD_TYPES:
            raise ValueError(f"field {self.name}: unknown type {self.type!r}")


def _all_nullable(*fields: Field) -> tuple[Field, ...]:
    return tuple(replace(f, nullable=True) for f in fields)


# ---------------------------------------------------------------- op records

HEADER: tuple[Field, ...] = (
    Field("id", "string", "", "communicator id (commHash), `0x` + 16 hex digits"),
    Field(
        "comm_name",
        "string",
        "",
        'communicator name given to NCCL, or `"unknown"` (PyTorch passes none)',
    ),
    Field("rank", "int", "", "rank of this process in the communicator"),
    Field("n_ranks", "int", "", "ranks in the communicator"),
    Field("nnodes", "int", "", "nodes spanned by the communicator"),
)

METADATA: tuple[Field, ...] = (
    Field(
        "inspector_output_format_version",
        "string",
        "",
        'always `"v4.0"` (the Inspector format this record extends)',
    ),
    Field("git_rev", "string", "", "rankwatch plugin version"),
    Field("rec_mechanism", "string", "", 'always `"nccl_profiler_interface"`'),
    Field("dump_timestamp_us", "int", "us", "host wall-clock time the record was written"),
    Field("hostname", "string", "", "host name"),
    Field("pid", "int", "", "process id"),
)

COLL_PERF: tuple[Field, ...] = (
    Field(
        "coll",
        "string",
        "",
        "NCCL function: AllReduce, AllGather, ReduceScatter, Broadcast, Reduce",
    ),
    Field(
        "coll_sn",
        "int",
        "",
        "NCCL's sequence number for this function on this communicator (per function, from 0)",
    ),
    Field(
        "coll_msg_size_bytes",
        "int",
        "bytes",
        "count x datatype size, as NCCL's Coll event reports them",
    ),
    Field(
        "coll_exec_time_us",
        "int",
        "us",
        "execution time: GPU end minus GPU start over all channels when GPU-timed, else host "
        "enqueue duration",
    ),
    Field(
        "coll_timing_source",
        "string",
        "",
        "`kernel_gpu` (GPU timer), or `collective_cpu` (no GPU timing for this op)",
    ),
    Field("coll_algobw_gbs", "float", "GB/s", "traffic / exec time (decimal GB)"),
    Field(
        "coll_busbw_gbs",
        "float",
        "GB/s",
        "algobw x nccl-tests bus factor: AllReduce 2(n-1)/n, AllGather and ReduceScatter "
        "(n-1)/n with traffic msg x n, others 1",
    ),
)

P2P_PERF: tuple[Field, ...] = (
    Field("p2p", "string", "", "`Send` or `Recv`"),
    Field(
        "p2p_sn",
        "int",
        "",
        "per-communicator counter of P2P ops on this rank (like Inspector's; not comparable "
        "across ranks)",
    ),
    Field("p2p_peer", "int", "", "peer rank in the communicator"),
    Field("p2p_msg_size_bytes", "int", "bytes", "count x datatype size"),
    Field("p2p_exec_time_us", "int", "us", "as coll_exec_time_us"),
    Field("p2p_timing_source", "string", "", "as coll_timing_source"),
    Field("p2p_algobw_gbs", "float", "GB/s", "size / exec time"),
    Field("p2p_busbw_gbs", "float", "GB/s", "equal to algobw (factor 1)"),
)

# Extension fields may be null whenever the plugin could not know the value
# (no GPU timing, graph replays, unknown datatype, ...).
RANKWATCH: tuple[Field, ...] = _all_nullable(
    Field("schema", "int", "", "record schema version (1)"),
    Field("kind", "string", "", "`coll` or `p2p`"),
    Field(
        "job_id",
        "string",
        "",
        'from RANKWATCH_JOB_ID, SLURM_JOB_ID or TORCHELASTIC_RUN_ID, else `"unknown"`',
    ),
    Field(
        "device",
        "int",
        "",
        "CUDA device of the communicator, when the process's CUDA runtime could tell; else null",
    ),
    Field("func", "string", "", "NCCL function name (as coll / p2p)"),
    Field(
        "seq",
        "int",
        "",
        "coll: NCCL sequence number (= coll_sn); p2p: per (peer, direction) order on this "
        "communicator, from 0, which matches the peer's order of the opposite direction",
    ),
    Field("datatype", "string", "", "NCCL datatype name, e.g. `ncclFloat32`"),
    Field("count", "int", "elements", "element count from NCCL's Coll/P2p event"),
    Field(
        "msg_size_bytes",
        "int",
        "bytes",
        "count x datatype size (null if the datatype is unknown)",
    ),
    Field("root", "int", "", "root rank (coll), else null"),
    Field("peer", "int", "", "peer rank (p2p), else null"),
    Field("algo", "string", "", "NCCL algorithm, e.g. `RING` (coll), else null"),
    Field("proto", "string", "", "NCCL protocol, e.g. `SIMPLE` (coll), else null"),
    Field("nchannels", "int", "", "channels NCCL planned for the op"),
    Field(
        "graph_captured",
        "bool",
        "",
        "the op was captured in a CUDA graph (this record is one replay)",
    ),
    Field(
        "api_start_ns",
        "int",
        "ns",
        "host time the application entered the NCCL call (CollApi/P2pApi start); null for "
        "graph replays",
    ),
    Field(
        "api_end_ns",
        "int",
        "ns",
        "host time the NCCL call returned (CollApi/P2pApi stop); null for graph replays",
    ),
    Field(
        "enqueue_start_ns",
        "int",
        "ns",
        "host time NCCL began handing the op to the GPU/proxy (Coll/P2p start)",
    ),
    Field("enqueue_end_ns", "int", "ns", "host time NCCL finished handing it over (Coll/P2p stop)"),
    Field(
        "arrival_ns",
        "int",
        "ns",
        "when this rank arrived at the op: api_start_ns when known, else enqueue_start_ns "
        "(for graph replays NCCL's host callback, which the replayed kernel does not wait for)",
    ),
    Field(
        "gpu_start_ns",
        "int",
        "ns",
        "earliest kernel-channel start of the op on the GPU, converted to host time; null "
        "when unknown or stale",
    ),
    Field("gpu_end_ns", "int", "ns", "latest kernel-channel end, converted to host time"),
    Field("gpu_start_raw_ns", "int", "ns", "the same on the GPU timer, unconverted"),
    Field("gpu_end_raw_ns", "int", "ns", "the same on the GPU timer, unconverted"),
    Field("clock_offset_ns", "int", "ns", "host minus GPU timer offset used for the conversion"),
    Field("clock_error_ns", "int", "ns", "half-width of the offset's bound at conversion time"),
    Field(
        "exec_time_ns",
        "int",
        "ns",
        "gpu_end_ns - gpu_start_ns when GPU-timed, else enqueue_end_ns - enqueue_start_ns",
    ),
    Field(
        "gpu_timed",
        "bool",
        "",
        "GPU start and end of the op are known (kernel-channel timing was on and the start "
        "was usable)",
    ),
    Field(
        "gpu_start_stale",
        "bool",
        "",
        "NCCL reported a channel start that belongs to an earlier op; gpu_start_ns is then "
        "null and timing falls back to collective_cpu",
    ),
    Field("channels_started", "int", "", "kernel channels seen starting"),
    Field("channels_stopped", "int", "", "kernel channels seen stopping"),
    Field(
        "complete",
        "bool",
        "",
        "all expected channels reported; false for ops flushed at teardown or exit before "
        "finishing",
    ),
)

# ------------------------------------------------------------- state records

COMM: tuple[Field, ...] = (
    Field("schema", "int", "", "record schema version"),
    Field("kind", "string", "", "`comm`"),
    Field("ts_ns", "int", "ns", "host time of communicator init"),
    Field("hostname", "string", "", "host name"),
    Field("pid", "int", "", "process id"),
    Field("job_id", "string", "", "as in op records"),
    Field("comm_id", "string", "", "communicator id"),
    Field("comm_name", "string", "", "as header.comm_name"),
    Field("rank", "int", "", "rank in the communicator"),
    Field("n_ranks", "int", "", "ranks in the communicator"),
    Field("nnodes", "int", "", "nodes in the communicator"),
    Field("device", "int", "", "CUDA device, or null", nullable=True),
    Field("abi_version", "int", "", "profiler interface version NCCL loaded (4, 5 or 6)"),
    Field("plugin_version", "string", "", "rankwatch plugin version"),
    Field("gpu_timing", "string", "", "`on`, `off` or `sampled`"),
)

PROGRESS: tuple[Field, ...] = (
    Field("schema", "int", "", "record schema version"),
    Field("kind", "string", "", "`progress`"),
    Field("ts_ns", "int", "ns", "host time the record was taken"),
    Field("hostname", "string", "", "host name"),
    Field("pid", "int", "", "process id"),
    Field("comm_id", "string", "", "communicator id"),
    Field("rank", "int", "", "rank in the communicator"),
    Field("n_ranks", "int", "", "ranks in the communicator"),
    Field(
        "reason",
        "string",
        "",
        "`interval`, `finalize` (communicator teardown) or `exit` (process exit)",
    ),
    Field(
        "colls",
        "object",
        "",
        'per collective function name: `{"enqueued": last seq enqueued, "started": last seq '
        'whose GPU work started, "completed": last seq completed}`, -1 for none',
    ),
    Field(
        "p2p",
        "object",
        "",
        '`{"send_enqueued", "send_completed", "recv_enqueued", "recv_completed"}`: counts of '
        "P2P ops",
    ),
    Field("last_activity_ns", "int", "ns", "host time of the last event seen on this communicator"),
    Field("in_flight_count", "int", "", "ops enqueued and not yet completed"),
    Field(
        "in_flight",
        "array",
        "",
        'up to 64 oldest in-flight ops: `{"kind", "func", "seq", "peer", "state", '
        '"arrival_ns", "age_ns", "channels_started", "channels_stopped"}`; state is '
        "`enqueuing` (inside NCCL's enqueue), `enqueued` (handed over, GPU not started), or "
        "`gpu_started`",
    ),
)

CLOCK: tuple[Field, ...] = (
    Field("schema", "int", "", "record schema version"),
    Field("kind", "string", "", "`clock`"),
    Field("ts_ns", "int", "ns", "host time the record was taken"),
    Field("hostname", "string", "", "host name"),
    Field("pid", "int", "", "process id"),
    Field("comm_id", "string", "", "communicator id"),
    Field("rank", "int", "", "rank in the communicator"),
    Field("n_ranks", "int", "", "ranks in the communicator"),
    Field(
        "offset_ns",
        "int",
        "ns",
        "estimated host CLOCK_REALTIME minus GPU timer; null until bounded",
        nullable=True,
    ),
    Field(
        "error_ns",
        "int",
        "ns",
        "half-width of [lower_ns, upper_ns]; null while only the upper bound is known",
        nullable=True,
    ),
    Field(
        "lower_ns",
        "int",
        "ns",
        "greatest lower bound: max over ops of (host time before launch - GPU start); null "
        "before the first GPU-timed op",
        nullable=True,
    ),
    Field(
        "upper_ns",
        "int",
        "ns",
        "least upper bound: min over kernel-channel events of (host report time - GPU "
        "timestamp); null before the first channel event",
        nullable=True,
    ),
    Field(
        "samples",
        "int",
        "",
        "kernel-channel events that contributed to the bounds in this window",
    ),
    Field("window_start_ns", "int", "ns", "start of the window the bounds were taken over"),
)

STATS: tuple[Field, ...] = (
    Field("schema", "int", "", "record schema version"),
    Field("kind", "string", "", "`stats`"),
    Field("ts_ns", "int", "ns", "host time the record was taken"),
    Field("hostname", "string", "", "host name"),
    Field("pid", "int", "", "process id"),
    Field("reason", "string", "", "`interval` or `exit`"),
    Field("slots_total", "int", "", "op slots in the plugin's fixed pool"),
    Field("slots_in_use", "int", "", "slots holding an in-flight or unwritten op"),
    Field("ops_started", "int", "", "Coll and P2p events accepted"),
    Field("records_written", "int", "", "op records written"),
    Field("dropped_pool_full", "int", "", "ops not recorded because every slot was in use"),
    Field("filtered_min_size", "int", "", "ops skipped on purpose by RANKWATCH_MIN_SIZE_BYTES"),
    Field(
        "stale_handles",
        "int",
        "",
        "events whose handle or parent was stale, foreign or unknown, ignored safely",
    ),
    Field(
        "write_errors",
        "int",
        "",
        "failed writes (output is disabled after the first; counted after)",
    ),
    Field("bytes_written", "int", "bytes", "bytes written to the op and state files"),
    Field(
        "stream_sent_records",
        "int",
        "",
        "record lines sent to the collector (RANKWATCH_COLLECTOR); 0 without one",
    ),
    Field(
        "stream_dropped_records",
        "int",
        "",
        "record lines not sent to the collector: its queue was full (collector away or "
        "slow) or the process exited first",
    ),
    Field(
        "stream_sent_bytes",
        "int",
        "bytes",
        "bytes sent to the collector, frame headers and hellos included",
    ),
    Field(
        "stream_reconnects",
        "int",
        "",
        "connections to the collector opened after the first",
    ),
)


OP_GROUPS: dict[str, tuple[Field, ...]] = {
    "header": HEADER,
    "metadata": METADATA,
    "coll_perf": COLL_PERF,
    "p2p_perf": P2P_PERF,
    "rankwatch": RANKWATCH,
}
STATE_KINDS: dict[str, tuple[Field, ...]] = {
    "comm": COMM,
    "progress": PROGRESS,
    "clock": CLOCK,
    "stats": STATS,
}
# Which perf object an op record of each rankwatch.kind carries.
PERF_GROUP_OF_KIND: dict[str, str] = {"coll": "coll_perf", "p2p": "p2p_perf"}

# --------------------------------------------------------------- validation

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),  # JSON writers may print a whole float as 3
    "string": (str,),
    "bool": (bool,),
    "object": (dict,),
    "array": (list,),
}


def json_type(value: Any) -> str:
    """The schema type name of a decoded JSON value ("null" for None)."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is a subclass of int
        return "bool"
    for name in ("int", "float", "string", "object", "array"):
        if isinstance(value, _PY_TYPES[name][-1]):
            return name
    return type(value).__name__


def _type_ok(value: Any, field: Field) -> bool:
    if value is None:
        return field.nullable
    if isinstance(value, bool):
        return field.type == "bool"
    return isinstance(value, _PY_TYPES[field.type])


def check_fields(obj: dict[str, Any], fields: tuple[Field, ...], prefix: str = "") -> list[str]:
    """Problems with obj against fields: missing keys and wrong types.

    Keys not in fields are allowed, so a reader keeps working when a later plugin
    of the same schema adds a field.
    """
    problems = []
    for field in fields:
        if field.name not in obj:
            problems.append(f"{prefix}{field.name}: missing")
            continue
        value = obj[field.name]
        if not _type_ok(value, field):
            null = " or null" if field.nullable else ""
            problems.append(
                f"{prefix}{field.name}: expected {field.type}{null}, got {json_type(value)}"
            )
    return problems


def _check_group(record: dict[str, Any], group: str) -> list[str]:
    sub = record.get(group)
    if not isinstance(sub, dict):
        found = "missing" if group not in record else f"got {json_type(sub)}"
        return [f"{group}: expected object, {found}"]
    return check_fields(sub, OP_GROUPS[group], prefix=f"{group}.")


def _perf_group(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The perf object this op record must carry, or a problem saying why none."""
    ext = record.get("rankwatch")
    kind = ext.get("kind") if isinstance(ext, dict) else None
    if kind in PERF_GROUP_OF_KIND:
        return PERF_GROUP_OF_KIND[kind], []
    present = [g for g in PERF_GROUP_OF_KIND.values() if g in record]
    if len(present) == 1:
        return present[0], []
    if not present:
        return None, ["coll_perf or p2p_perf: missing"]
    return None, ["coll_perf and p2p_perf: a record carries only one"]


def validate_op_record(record: Any) -> list[str]:
    """Human-readable problems with one decoded op-record line; [] when valid."""
    if not isinstance(record, dict):
        return [f"op record: expected object, got {json_type(record)}"]
    problems: list[str] = []
    for group in ("header", "metadata", "rankwatch"):
        problems += _check_group(record, group)
    perf, perf_problems = _perf_group(record)
    problems += perf_problems
    if perf is not None:
        problems += _check_group(record, perf)
        other = "p2p_perf" if perf == "coll_perf" else "coll_perf"
        if other in record:
            problems.append(f"{other}: unexpected in a record carrying {perf}")
    return problems


def validate_state_record(record: Any) -> list[str]:
    """Human-readable problems with one decoded state-record line; [] when valid."""
    if not isinstance(record, dict):
        return [f"state record: expected object, got {json_type(record)}"]
    kind = record.get("kind")
    if kind not in STATE_KINDS:
        known = ", ".join(STATE_KINDS)
        return [f"kind: unknown state record kind {kind!r} (expected one of {known})"]
    return check_fields(record, STATE_KINDS[kind])


def record_schema_version(record: Any) -> Any:
    """The schema number a record declares: top level (state) or rankwatch.schema (op)."""
    if not isinstance(record, dict):
        return None
    if "schema" in record:
        return record["schema"]
    ext = record.get("rankwatch")
    return ext.get("schema") if isinstance(ext, dict) else None


def check_schema_version(
    record: Any, where: str | os.PathLike[str] | None = None, line: int | None = None
) -> int:
    """Return the record's schema version, or raise if it cannot be read.

    Older versions are accepted (readers stay compatible); a newer one raises
    SchemaVersionError naming both versions, a missing or malformed one RecordError.
    """
    version = record_schema_version(record)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordError(
            f"no valid schema version (got {version!r}); is this a rankwatch record?",
            file=where,
            line=line,
            field="schema",
        )
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(version, SCHEMA_VERSION, file=where, line=line)
    return version
