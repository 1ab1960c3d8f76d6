"""Per-line checks of the careful reader: is this decoded line a usable op or
state record, and what is wrong with it if not."""

from __future__ import annotations

from typing import Any

from rankwatch import schema
from rankwatch.store.lines import Verdict, null_wrong_types, schema_verdict
from rankwatch.store.tables import DUMP_STATS_FIELDS

# Without these an op cannot be placed: (group, field, type).
OP_KEYS = (
    ("header", "id", str),
    ("header", "rank", int),
    ("metadata", "hostname", str),
    ("metadata", "pid", int),
)
STATE_KEYS = (("ts_ns", int), ("hostname", str), ("pid", int))
COMM_SCOPED_KEYS = (("comm_id", str), ("rank", int))


def _missing_keys(obj: dict[str, Any], perf: str) -> list[str]:
    missing = []
    for group, name, typ in OP_KEYS:
        value = obj[group].get(name) if isinstance(obj.get(group), dict) else None
        if not isinstance(value, typ) or isinstance(value, bool):
            missing.append(f"{group}.{name}")
    func_key = "coll" if perf == "coll_perf" else "p2p"
    ext = obj.get("rankwatch") if isinstance(obj.get("rankwatch"), dict) else {}
    if not isinstance(obj[perf].get(func_key), str) and not isinstance(ext.get("func"), str):
        missing.append(f"{perf}.{func_key}")
    seq = ext.get("seq", obj[perf].get("coll_sn")) if perf == "coll_perf" else 0
    if not isinstance(seq, int) or isinstance(seq, bool):
        missing.append("rankwatch.seq / coll_perf.coll_sn")
    return missing


def _groups_are_objects(obj: dict[str, Any], groups: tuple[str, ...]) -> list[str]:
    return [
        f"{g}: expected object, got {schema.json_type(obj.get(g))}"
        for g in groups
        if g in obj and not isinstance(obj[g], dict)
    ]


def _dump_stats_row(obj: dict[str, Any]) -> Verdict:
    stats = obj["dump_stats"] if isinstance(obj["dump_stats"], dict) else {}
    header = obj.get("header") if isinstance(obj.get("header"), dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    row = {n: stats.get(n) if isinstance(stats.get(n), int) else None for n in DUMP_STATS_FIELDS}
    ts = meta.get("dump_timestamp_us")
    row.update(
        host=meta.get("hostname"),
        pid=meta.get("pid"),
        comm_id=header.get("id"),
        rank=header.get("rank"),
        ts_ns=ts * 1000 if isinstance(ts, int) else None,
    )
    return Verdict(row, role="dump_stats")


def check_op(obj: Any) -> Verdict:
    """Verdict on one decoded line of an op file."""
    if not isinstance(obj, dict):
        return Verdict(
            None, "not_an_object", f"expected a JSON object, got {schema.json_type(obj)}"
        )
    if "dump_stats" in obj:
        return _dump_stats_row(obj)
    if "proxy_trace" in obj:
        return Verdict({}, role="proxy")
    perf = next((p for p in ("coll_perf", "p2p_perf") if isinstance(obj.get(p), dict)), None)
    if perf is None:
        return Verdict(
            None, "not_an_op_record", "no coll_perf or p2p_perf object: not an op record"
        )
    if "rankwatch" in obj and (bad := schema_verdict(obj)) is not None:
        return bad
    shape = _groups_are_objects(obj, ("header", "metadata", "rankwatch", "event_trace_ts"))
    if shape:
        return Verdict(None, "wrong_type", "; ".join(shape))
    missing = _missing_keys(obj, perf)
    if missing:
        return Verdict(
            None, "missing_field", "missing or wrongly typed key field(s): " + ", ".join(missing)
        )
    return _null_op_types(obj, perf)


def _null_op_types(obj: dict[str, Any], perf: str) -> Verdict:
    problems = []
    for group in ("header", "metadata", perf, "rankwatch"):
        if isinstance(obj.get(group), dict):
            problems += null_wrong_types(obj[group], schema.OP_GROUPS[group], f"{group}.")
    if not problems:
        return Verdict(obj)
    return Verdict(
        obj, "wrong_type", "; ".join(problems) + " (set to null, line kept)", repaired=True
    )


def check_state(obj: Any) -> Verdict:
    """Verdict on one decoded line of a state file."""
    if not isinstance(obj, dict):
        return Verdict(
            None, "not_an_object", f"expected a JSON object, got {schema.json_type(obj)}"
        )
    if (bad := schema_verdict(obj)) is not None:
        return bad
    kind = obj.get("kind")
    if kind not in schema.STATE_KINDS:
        return Verdict(None, "unknown_kind", f"kind: unknown state record kind {kind!r}")
    keys = STATE_KEYS + (COMM_SCOPED_KEYS if kind != "stats" else ())
    missing = [
        n for n, typ in keys if not isinstance(obj.get(n), typ) or isinstance(obj.get(n), bool)
    ]
    if missing:
        return Verdict(
            None, "missing_field", "missing or wrongly typed key field(s): " + ", ".join(missing)
        )
    problems = null_wrong_types(obj, schema.STATE_KINDS[kind], "")
    if kind == "progress":
        problems += _null_bad_progress(obj)
    if not problems:
        return Verdict(obj, role="state")
    return Verdict(
        obj,
        "wrong_type",
        "; ".join(problems) + " (set to null, line kept)",
        repaired=True,
        role="state",
    )


_PROGRESS_SHAPES = {
    "colls": lambda v: (
        isinstance(v, dict)
        and all(
            isinstance(c, dict)
            and all(_is_int(c.get(k)) for k in ("enqueued", "started", "completed"))
            for c in v.values()
        )
    ),
    "p2p": lambda v: isinstance(v, dict) and all(_is_int(x) for x in v.values()),
    "in_flight": lambda v: (
        isinstance(v, list)
        and all(
            isinstance(op, dict) and _is_int(op.get("seq")) and _is_int(op.get("arrival_ns"))
            for op in v
        )
    ),
}


def _is_int(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _null_bad_progress(obj: dict[str, Any]) -> list[str]:
    """Null nested progress objects whose inner values have the wrong types."""
    problems = []
    for name, ok in _PROGRESS_SHAPES.items():
        if obj.get(name) is not None and not ok(obj[name]):
            problems.append(f"{name}: malformed nested values")
            obj[name] = None
    return problems
