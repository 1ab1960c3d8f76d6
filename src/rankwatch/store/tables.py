"""Table definitions of the store, and the JSON column types DuckDB reads
record files with.

Field names come from rankwatch.schema (the one definition of the record
format); this module only decides their SQL types and the flat column names
of the `ops` table. Everything is plain SQL types so the tables export to
Parquet and the queries transpile to other engines.
"""

from __future__ import annotations

from rankwatch import schema

SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "string": "VARCHAR", "bool": "BOOLEAN"}

# ----------------------------------------------------------------- op records

# Inspector fields rankwatch does not write but readers should keep.
_INSPECTOR_COLL_EXTRA = {"coll_algo": "VARCHAR", "coll_proto": "VARCHAR"}
_TRACE_TS = (
    "STRUCT(coll_start_ts BIGINT, coll_stop_ts BIGINT, p2p_start_ts BIGINT, p2p_stop_ts BIGINT, "
    "kernel_events STRUCT(channel_id INTEGER, kernel_start_ts BIGINT, kernel_stop_ts BIGINT)[])"
)
DUMP_STATS_FIELDS = (
    "coll_records", "coll_dropped_total", "coll_dropped_since_last_dump",
    "p2p_records", "p2p_dropped_total", "p2p_dropped_since_last_dump",
)  # fmt: skip


def _fields(fields: tuple[schema.Field, ...], extra: dict[str, str] | None = None):
    out = [(f.name, SQL_TYPES[f.type]) for f in fields if f.type in SQL_TYPES]
    return tuple(out + list((extra or {}).items()))


# The objects of an op-record line whose scalar fields are read, in the order the
# plugin writes them: (field, SQL type). Both readers (DuckDB's and the native
# one, rankwatch.store.native) take their field types from here.
OP_GROUP_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "header": _fields(schema.HEADER),
    "metadata": _fields(schema.METADATA),
    "coll_perf": _fields(schema.COLL_PERF, _INSPECTOR_COLL_EXTRA),
    "p2p_perf": _fields(schema.P2P_PERF),
    "rankwatch": _fields(schema.RANKWATCH),
}


def _struct(fields: tuple[tuple[str, str], ...]) -> str:
    return f"STRUCT({', '.join(f'{name} {sql}' for name, sql in fields)})"


def op_json_columns() -> dict[str, str]:
    """Top-level keys of an op-record line and the DuckDB type each is read as."""
    groups = {name: _struct(fields) for name, fields in OP_GROUP_FIELDS.items()}
    return {
        "header": groups["header"],
        "metadata": groups["metadata"],
        "coll_perf": groups["coll_perf"],
        "p2p_perf": groups["p2p_perf"],
        "event_trace_ts": _TRACE_TS,
        "event_trace_sn": "JSON",
        "rankwatch": groups["rankwatch"],
        "dump_stats": "STRUCT(" + ", ".join(f"{n} BIGINT" for n in DUMP_STATS_FIELDS) + ")",
        "proxy_trace": "JSON",
    }


# (column, SQL type, SQL expression over the JSON columns above, and a leaner
# expression used for files of rankwatch records, or None when the same). The
# ops table is exactly these columns, in this order. Lean expressions read only
# the rankwatch object where it has the value, so DuckDB transforms fewer
# fields (about a quarter faster).
_R = "rankwatch"
_INSPECTOR = f"{_R} IS NULL"
_TS = "event_trace_ts"


def _lambda(body: str) -> str:
    """`e -> body` in the lambda syntax of the installed DuckDB (1.3 added `lambda e:`)."""
    import duckdb

    major, minor = (int(x) for x in duckdb.__version__.split(".")[:2])
    return f"lambda e: {body}" if (major, minor) >= (1, 3) else f"e -> {body}"


_KERNEL_START = f"list_min(list_transform({_TS}.kernel_events, {_lambda('e.kernel_start_ts')}))"
_KERNEL_STOP = f"list_max(list_transform({_TS}.kernel_events, {_lambda('e.kernel_stop_ts')}))"
_UNDECODED = "(header IS NULL AND metadata IS NULL)"
_SHAPE = (
    "CASE WHEN coll_perf IS NOT NULL THEN 'coll' WHEN p2p_perf IS NOT NULL THEN 'p2p' "
    "WHEN dump_stats IS NOT NULL THEN 'dump_stats' WHEN proxy_trace IS NOT NULL THEN 'proxy' "
    f"WHEN {_UNDECODED} THEN 'undecodable' ELSE 'other' END"
)
_LEAN_SHAPE = (
    f"CASE WHEN {_R}.kind IN ('coll', 'p2p') THEN {_R}.kind "
    f"WHEN {_UNDECODED} THEN 'undecodable' ELSE 'other' END"
)
# fmt: off
OP_COLUMNS: tuple[tuple[str, str, str, str | None], ...] = (
    ("source_file", "VARCHAR", "?", None),
    ("source_format", "VARCHAR",
     f"CASE WHEN {_INSPECTOR} THEN 'inspector' ELSE 'rankwatch' END", None),
    ("schema_version", "INTEGER", f"coalesce({_R}.schema, 1)", None),
    ("host", "VARCHAR", "metadata.hostname", None),
    ("pid", "BIGINT", "metadata.pid", None),
    ("job_id", "VARCHAR", f"{_R}.job_id", None),
    ("comm_id", "VARCHAR", "header.id", None),
    ("comm_key", "VARCHAR", "'0x' || left(ltrim(lower(substr(header.id, 3)), '0'), 14)", None),
    ("comm_name", "VARCHAR", "header.comm_name", None),
    ("rank", "INTEGER", "header.rank", None),
    ("n_ranks", "INTEGER", "header.n_ranks", None),
    ("nnodes", "INTEGER", "header.nnodes", None),
    ("device", "INTEGER", f"{_R}.device", None),
    ("kind", "VARCHAR", _SHAPE, _LEAN_SHAPE),
    ("func", "VARCHAR", f"coalesce({_R}.func, coll_perf.coll, p2p_perf.p2p)", f"{_R}.func"),
    ("seq", "BIGINT", f"coalesce({_R}.seq, coll_perf.coll_sn)", f"{_R}.seq"),
    ("p2p_sn", "BIGINT", "p2p_perf.p2p_sn", None),
    ("peer", "INTEGER", f"coalesce({_R}.peer, p2p_perf.p2p_peer)", f"{_R}.peer"),
    ("root", "INTEGER", f"{_R}.root", None),
    ("datatype", "VARCHAR", f"{_R}.datatype", None),
    ("count", "BIGINT", f"{_R}.count", None),
    ("msg_bytes", "BIGINT",
     f"coalesce({_R}.msg_size_bytes, coll_perf.coll_msg_size_bytes, "
     "p2p_perf.p2p_msg_size_bytes)",
     f"{_R}.msg_size_bytes"),
    ("algo", "VARCHAR", f"coalesce({_R}.algo, coll_perf.coll_algo)", f"{_R}.algo"),
    ("proto", "VARCHAR", f"coalesce({_R}.proto, coll_perf.coll_proto)", f"{_R}.proto"),
    ("nchannels", "INTEGER", f"{_R}.nchannels", None),
    ("graph_captured", "BOOLEAN", f"{_R}.graph_captured", None),
    ("api_start_ns", "BIGINT", f"{_R}.api_start_ns", None),
    ("api_end_ns", "BIGINT", f"{_R}.api_end_ns", None),
    ("enqueue_start_ns", "BIGINT",
     f"coalesce({_R}.enqueue_start_ns, "
     f"1000 * coalesce({_TS}.coll_start_ts, {_TS}.p2p_start_ts))",
     f"{_R}.enqueue_start_ns"),
    ("enqueue_end_ns", "BIGINT",
     f"coalesce({_R}.enqueue_end_ns, 1000 * coalesce({_TS}.coll_stop_ts, {_TS}.p2p_stop_ts))",
     f"{_R}.enqueue_end_ns"),
    ("arrival_ns", "BIGINT",
     f"coalesce({_R}.arrival_ns, 1000 * coalesce({_TS}.coll_start_ts, {_TS}.p2p_start_ts))",
     f"{_R}.arrival_ns"),
    ("gpu_start_ns", "BIGINT",
     f"CASE WHEN {_INSPECTOR} THEN 1000 * {_KERNEL_START} ELSE {_R}.gpu_start_ns END",
     f"{_R}.gpu_start_ns"),
    ("gpu_end_ns", "BIGINT",
     f"CASE WHEN {_INSPECTOR} THEN 1000 * {_KERNEL_STOP} ELSE {_R}.gpu_end_ns END",
     f"{_R}.gpu_end_ns"),
    ("clock_offset_ns", "BIGINT", f"{_R}.clock_offset_ns", None),
    ("clock_error_ns", "BIGINT", f"{_R}.clock_error_ns", None),
    ("exec_time_ns", "BIGINT",
     f"coalesce({_R}.exec_time_ns, "
     "1000 * coalesce(coll_perf.coll_exec_time_us, p2p_perf.p2p_exec_time_us))",
     f"{_R}.exec_time_ns"),
    ("gpu_timed", "BOOLEAN",
     f"coalesce({_R}.gpu_timed, "
     "coalesce(coll_perf.coll_timing_source, p2p_perf.p2p_timing_source) = 'kernel_gpu')",
     f"{_R}.gpu_timed"),
    ("gpu_start_stale", "BOOLEAN", f"{_R}.gpu_start_stale", None),
    ("complete", "BOOLEAN", f"coalesce({_R}.complete, true)", f"{_R}.complete"),
    ("timing_source", "VARCHAR",
     "coalesce(coll_perf.coll_timing_source, p2p_perf.p2p_timing_source)",
     f"CASE WHEN {_R}.gpu_timed THEN 'kernel_gpu' ELSE 'collective_cpu' END"),
    ("algbw_gbs", "DOUBLE", "coalesce(coll_perf.coll_algobw_gbs, p2p_perf.p2p_algobw_gbs)", None),
    ("busbw_gbs", "DOUBLE", "coalesce(coll_perf.coll_busbw_gbs, p2p_perf.p2p_busbw_gbs)", None),
    ("dump_ts_us", "BIGINT", "metadata.dump_timestamp_us", None),
)
# fmt: on
OP_KINDS = ("coll", "p2p")
OP_RECORD_FILTER = "(coll_perf IS NOT NULL OR p2p_perf IS NOT NULL)"
# Columns without which an op cannot be aligned: a file with such rows is re-read
# line by line so each bad line is reported.
OP_KEY_COLUMNS = ("host", "pid", "comm_id", "rank", "func")

# ---------------------------------------------------------------- state records

_STATE_FIELDS: dict[str, tuple[schema.Field, ...]] = schema.STATE_KINDS


def state_json_columns() -> dict[str, str]:
    """Every scalar field of every state kind, plus progress's nested objects."""
    columns: dict[str, str] = {}
    for fields in _STATE_FIELDS.values():
        for f in fields:
            if f.type in SQL_TYPES:
                columns.setdefault(f.name, SQL_TYPES[f.type])
    columns["colls"] = "MAP(VARCHAR, STRUCT(enqueued BIGINT, started BIGINT, completed BIGINT))"
    columns["p2p"] = (
        "STRUCT(send_enqueued BIGINT, send_completed BIGINT, recv_enqueued BIGINT, "
        "recv_completed BIGINT)"
    )
    columns["in_flight"] = (
        "STRUCT(kind VARCHAR, func VARCHAR, seq BIGINT, peer INTEGER, state VARCHAR, "
        "arrival_ns BIGINT, age_ns BIGINT, channels_started INTEGER, channels_stopped INTEGER)[]"
    )
    return columns


def _state_columns(kind: str, nested: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    cols = [("source_file", "VARCHAR")]
    cols += [(f.name, SQL_TYPES[f.type]) for f in _STATE_FIELDS[kind] if f.type in SQL_TYPES]
    cols = [(("host" if n == "hostname" else n), t) for n, t in cols if n != "kind"]
    return cols + list(nested)


_PROGRESS_NESTED = (
    ("colls", state_json_columns()["colls"]),
    ("p2p", state_json_columns()["p2p"]),
    ("in_flight", state_json_columns()["in_flight"]),
)
STATE_TABLE_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "comms": _state_columns("comm"),
    "progress": _state_columns("progress", _PROGRESS_NESTED),
    "clock": _state_columns("clock"),
    "stats": _state_columns("stats")
    # rank as the other state tables have it: a stats record may carry one (the
    # state reader reads every state field of every kind), and an INTEGER column
    # failed the insert of a whole job's state records on one beyond 32 bits
    + [("source_format", "VARCHAR"), ("comm_id", "VARCHAR"), ("rank", "BIGINT")]
    + [(n, "BIGINT") for n in DUMP_STATS_FIELDS],
}
STATE_KIND_OF_TABLE = {"comms": "comm", "progress": "progress", "clock": "clock", "stats": "stats"}

# files.reader: "duckdb" when a bulk reader took the file whole (DuckDB's JSON reader
# or the native one, see rankwatch.store.native), "python" when the careful
# line-by-line reader read it (the file had bad lines).
FILES_COLUMNS = (
    ("path", "VARCHAR"), ("role", "VARCHAR"), ("format", "VARCHAR"), ("bytes", "BIGINT"),
    ("records", "BIGINT"), ("bad_lines", "BIGINT"), ("reader", "VARCHAR"),
)  # fmt: skip
PROBLEMS_COLUMNS = (
    ("file", "VARCHAR"), ("line", "BIGINT"), ("kind", "VARCHAR"), ("message", "VARCHAR"),
    ("repeats", "BIGINT"),
)  # fmt: skip


def create_sql(name: str, columns: list[tuple[str, str]] | tuple) -> str:
    body = ", ".join(f'"{c}" {t}' for c, t in columns)
    return f"CREATE TABLE {name} ({body})"


def create_all(con) -> None:  # noqa: ANN001 - a duckdb connection
    con.execute(create_sql("ops", [(c, t) for c, t, _, _ in OP_COLUMNS]))
    for table, columns in STATE_TABLE_COLUMNS.items():
        con.execute(create_sql(table, columns))
    con.execute(create_sql("files", FILES_COLUMNS))
    con.execute(create_sql("problems", PROBLEMS_COLUMNS))
