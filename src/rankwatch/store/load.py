"""The fast path: DuckDB's JSON reader over whole files, many at a time.

Every key a record can carry is declared with its type (DuckDB reads lines
with many undeclared keys an order of magnitude slower). Reading is lenient
(`ignore_errors`): a damaged line becomes a row of NULLs that the op filter
drops, so per-file row counts, compared with line counts, show which files
need the careful line-by-line reader.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb

from rankwatch import schema
from rankwatch.store.tables import (
    DUMP_STATS_FIELDS,
    OP_COLUMNS,
    OP_KEY_COLUMNS,
    OP_KINDS,
    STATE_KIND_OF_TABLE,
    STATE_TABLE_COLUMNS,
    op_json_columns,
    state_json_columns,
)


def sql_str(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _struct_literal(columns: dict[str, str]) -> str:
    return "{" + ", ".join(f"{sql_str(k)}: {sql_str(v)}" for k, v in columns.items()) + "}"


def read_json_sql(paths: list[str], columns: dict[str, str], lenient: bool) -> str:
    files = "[" + ", ".join(sql_str(p) for p in paths) + "]"
    return (
        f"read_json({files}, format='newline_delimited', columns={_struct_literal(columns)}, "
        f"filename=true, ignore_errors={'true' if lenient else 'false'})"
    )


def read_objects_sql(paths: list[str], columns: dict[str, str]) -> str:
    """What read_json_sql(paths, columns, lenient=True) reads, the same rows and
    values (a line DuckDB cannot decode, or that is no object, is a row of NULLs; a
    field of the wrong type is NULL), through read_ndjson_objects and json_transform:
    DuckDB's typed read_json costs about 3 ms per file before reading a line (a
    thousand ranks' state files: 3 s of a 0.2 s read)."""
    files = "[" + ", ".join(sql_str(p) for p in paths) + "]"
    spec = sql_str(json.dumps(columns))
    # json_valid: DuckDB 1.x passes a line with content after its object (two records
    # glued by a writer killed mid-line) on to json_transform, which raises; as a row
    # of NULLs it goes, like any line DuckDB cannot decode, to the careful reader
    return (
        f"(SELECT unnest(CASE WHEN json_valid(json) THEN json_transform(json, {spec}) END), "
        f"filename FROM read_ndjson_objects({files}, filename=true, ignore_errors=true))"
    )


def op_projection(source: str, lean: bool, given: dict[str, str] | None = None) -> str:
    """The SELECT list mapping the JSON columns (tables.op_json_columns) to ops;
    `given`: ops columns whose value the source already has, by SQL expression."""
    parts = []
    for name, _, expr, lean_expr in OP_COLUMNS:
        if name == "source_file":
            expr = source
        elif given and name in given:
            expr = given[name]
        elif lean and lean_expr is not None:
            expr = lean_expr
        parts.append(f'{expr} AS "{name}"')
    return ", ".join(parts)


T = TypeVar("T")


def without_unreadable(
    paths: list[str], load: Callable[[list[str]], T]
) -> tuple[T | None, list[str]]:
    """load(paths), leaving out the files DuckDB cannot read to their end (a gzip
    stream cut short by a killed writer fails the whole multi-file scan, and the
    statement with it): each time the error names one of the files, that file is
    left out and the rest loaded again. Returns load's result (None when no file
    was left) and the files left out, for the careful reader, which keeps their
    lines up to the damage."""
    todo, left_out = list(paths), []
    while todo:
        try:
            return load(todo), left_out
        except duckdb.Error as exc:
            named = [p for p in todo if p in str(exc)]
            if not named:
                raise
            bad = max(named, key=len)  # a path may begin another's name
            todo.remove(bad)
            left_out.append(bad)
    return None, left_out


def load_ops(
    con: Any, paths: list[str], lenient: bool = True, source: str = "filename", lean: bool = False
) -> None:
    """Append every line of `paths` to `ops` (source: SQL for source_file).

    Lines that are not op records land too, with kind 'dump_stats', 'proxy',
    'undecodable' or 'other', so file_stats() can count them; drop_non_ops()
    removes them. lean: the files hold rankwatch records (see tables.OP_COLUMNS).
    """
    if not paths:
        return
    reader = read_json_sql(paths, op_json_columns(), lenient)
    con.execute(f"INSERT INTO ops SELECT {op_projection(source, lean)} FROM {reader}")


def drop_non_ops(con: Any) -> None:
    kinds = ", ".join(sql_str(k) for k in OP_KINDS)
    con.execute(f"DELETE FROM ops WHERE kind IS NULL OR kind NOT IN ({kinds})")


def load_dump_stats(con: Any, paths: list[str], lenient: bool = True) -> None:
    """Append RCCL Inspector `dump_stats` records of `paths` to `stats`."""
    if not paths:
        return
    reader = read_json_sql(paths, op_json_columns(), lenient)
    fields = ", ".join(f"dump_stats.{n}" for n in DUMP_STATS_FIELDS)
    names = ", ".join(DUMP_STATS_FIELDS)
    con.execute(
        f"INSERT INTO stats (source_file, source_format, ts_ns, host, pid, comm_id, rank, {names}) "
        f"SELECT filename, 'inspector', 1000 * metadata.dump_timestamp_us, metadata.hostname, "
        f"metadata.pid, header.id, header.rank, {fields} FROM {reader} "
        f"WHERE dump_stats IS NOT NULL"
    )


@dataclass(frozen=True)
class OpFileCounts:
    ops: int = 0  # usable op records
    null_keys: int = 0  # op records missing a key column
    newer: int = 0  # op records of a newer schema
    undecodable: int = 0  # lines DuckDB could not decode
    other: int = 0  # decoded lines that are not op, dump_stats or proxy records
    inspector: int = 0  # Inspector records (matters for files read the lean way)
    extra: int = 0  # dump_stats and proxy records
    unreadable: bool = False  # DuckDB could not read it to the end (see without_unreadable)

    @property
    def clean(self) -> bool:
        return not (
            self.null_keys or self.newer or self.undecodable or self.other or self.unreadable
        )


def op_file_stats(con: Any) -> dict[str, OpFileCounts]:
    null_keys = " OR ".join(f'"{c}" IS NULL' for c in OP_KEY_COLUMNS)
    ops = "kind IN ('coll', 'p2p')"
    rows = con.execute(
        f"SELECT source_file, "
        f"count(*) FILTER (WHERE {ops} AND NOT ({null_keys}) "
        f"AND schema_version <= {schema.SCHEMA_VERSION}), "
        f"count(*) FILTER (WHERE {ops} AND ({null_keys} OR (kind = 'coll' AND seq IS NULL))), "
        f"count(*) FILTER (WHERE {ops} AND schema_version > {schema.SCHEMA_VERSION}), "
        f"count(*) FILTER (WHERE kind = 'undecodable'), count(*) FILTER (WHERE kind = 'other'), "
        f"count(*) FILTER (WHERE source_format = 'inspector' AND kind <> 'undecodable'), "
        f"count(*) FILTER (WHERE kind IN ('dump_stats', 'proxy')) "
        f"FROM ops GROUP BY source_file"
    ).fetchall()
    return {path: OpFileCounts(*(int(x) for x in rest)) for path, *rest in rows}


def delete_files(con: Any, table: str, paths: list[str]) -> None:
    if paths:
        listed = ", ".join(sql_str(p) for p in paths)
        con.execute(f"DELETE FROM {table} WHERE source_file IN ({listed})")


# A state record is usable when it has a known kind, these fields, and the
# communicator's for every kind but stats (the native reader checks the same:
# store.native_state)
STATE_KEY_FIELDS = ("ts_ns", "hostname", "pid")
STATE_COMM_KEY_FIELDS = ("comm_id", "rank")
STATE_UNSCOPED_KINDS = ("stats",)


def _all_set(fields: tuple[str, ...]) -> str:
    return " AND ".join(f"{f} IS NOT NULL" for f in fields)


_STATE_KEYS_OK = (
    f"kind IN ({', '.join(sql_str(k) for k in STATE_KIND_OF_TABLE.values())}) "
    f"AND {_all_set(STATE_KEY_FIELDS)} AND (kind IN "
    f"({', '.join(sql_str(k) for k in STATE_UNSCOPED_KINDS)}) "
    f"OR ({_all_set(STATE_COMM_KEY_FIELDS)}))"
)


def stage_state(
    con: Any,
    paths: list[str],
    lenient: bool = True,
    source: str = "filename",
    table: str = "raw_state",
) -> dict[str, tuple[int, int]]:
    """Read state files into a staging table.

    Returns per file (usable rows, bad rows): bad = key fields missing or a newer
    schema; lines DuckDB could not decode at all (all-NULL rows) count as neither.
    """
    columns = state_json_columns()
    reader = read_objects_sql(paths, columns) if lenient else read_json_sql(paths, columns, False)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {table} AS "
        f"SELECT {source} AS source_file, * EXCLUDE (filename) FROM {reader}"
    )
    ok = f"coalesce({_STATE_KEYS_OK}, false) AND coalesce(schema, 1) <= {schema.SCHEMA_VERSION}"
    undecoded = "(kind IS NULL AND schema IS NULL AND hostname IS NULL AND ts_ns IS NULL)"
    rows = con.execute(
        f"SELECT source_file, count(*) FILTER (WHERE {ok}), "
        f"count(*) FILTER (WHERE NOT ({ok}) AND NOT {undecoded}) "
        f"FROM {table} GROUP BY source_file"
    ).fetchall()
    return {path: (int(a), int(b)) for path, a, b in rows}


def state_insert_sql(target: str, source: str, transform: dict[str, str] | None = None) -> str:
    """INSERT INTO target (comms, progress, clock or stats) its kind's rows of
    `source`, whose columns are state_json_columns() (and source_file); the
    columns named in `transform` hold JSON text, typed with json_transform."""
    transform = transform or {}
    names = [c for c, _ in STATE_TABLE_COLUMNS[target]]
    exprs = []
    for c in names:
        if c == "host":
            exprs.append("hostname")
        elif c == "source_format":
            exprs.append("'rankwatch'")
        elif target == "stats" and c in DUMP_STATS_FIELDS:
            exprs.append("NULL")
        elif c in transform:
            exprs.append(f'json_transform("{c}", {sql_str(json.dumps(transform[c]))})')
        else:
            exprs.append(f'"{c}"')
    cols = ", ".join(f'"{c}"' for c in names)
    return (
        f"INSERT INTO {target} ({cols}) SELECT {', '.join(exprs)} FROM {source} "
        f"WHERE kind = '{STATE_KIND_OF_TABLE[target]}'"
    )


def delete_state_files(con: Any, paths: list[str]) -> None:
    """Remove these files' rows from every state table (after an insert that failed
    part way: the tables it had filled keep nothing of them)."""
    for target in STATE_KIND_OF_TABLE:
        delete_files(con, target, paths)


def distribute_state(con: Any, exclude: list[str], table: str = "raw_state") -> None:
    """Move staged state records into comms, progress, clock and stats; drop the stage."""
    skip = f"AND source_file NOT IN ({', '.join(sql_str(p) for p in exclude)})" if exclude else ""
    for target in STATE_KIND_OF_TABLE:
        con.execute(
            f"{state_insert_sql(target, table)} AND {_STATE_KEYS_OK} "
            f"AND coalesce(schema, 1) <= {schema.SCHEMA_VERSION} {skip}"
        )
    con.execute(f"DROP TABLE {table}")


def insert_tuples(con: Any, table: str, columns: list[str], rows: list[tuple]) -> None:
    """Insert rows given as tuples, in the order of `columns` ("name TYPE" or "name"),
    in one statement (DuckDB's executemany runs one statement per row: 2 ms each)."""
    names = [c.split()[0] for c in columns]
    insert_rows(con, table, [dict(zip(names, r, strict=True)) for r in rows])


def insert_rows(con: Any, table: str, rows: list[dict[str, Any]]) -> None:
    """Insert Python rows (dict per row) by column name, in one statement."""
    if not rows:
        return
    import pyarrow as pa

    names = list(rows[0])
    cols = ", ".join(f'"{n}"' for n in names)
    try:
        arrays = [pa.array([r.get(n) for r in rows]) for n in names]
    except (pa.ArrowException, TypeError, OverflowError):  # mixed types: let DuckDB cast
        marks = ", ".join("?" for _ in names)
        con.executemany(
            f"INSERT INTO {table} ({cols}) VALUES ({marks})",
            [[r.get(n) for n in names] for r in rows],
        )
        return
    batch = pa.Table.from_arrays(arrays, names=[f"c{i}" for i in range(len(names))])
    con.register("rankwatch_rows", batch)
    try:
        con.execute(f"INSERT INTO {table} ({cols}) SELECT * FROM rankwatch_rows")
    finally:
        con.unregister("rankwatch_rows")
