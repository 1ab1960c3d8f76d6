"""Collectives: find each rank's communication ops, describe them, match them
across ranks, check that matched ranks agree, and split each rank's time in a
collective into transfer and wait.

Identity across ranks (in order of preference):
  (process group, Seq) when every rank's trace carries Seq for that group;
  (process group, step, k) otherwise: the k-th collective of that group inside
  the step, so that an extra or missing op only disturbs its own step.
Matched ops must agree on collective, element counts, dtype and bytes (fields a
trace lacks are not compared); disagreements are reported, not hidden.

Transfer vs wait (clock-free): a collective ends on all ranks at about the same
moment, and the last rank to arrive does not wait, so the shortest duration across
ranks is the transfer time and each rank's excess over it is time spent waiting
for that last rank (the named peer). Ranks without a trace cannot be seen: their
lateness would show up as transfer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rankwatch.explain.events import CollMeta, Kind, RankTrace, meta_from_kernel_name
from rankwatch.explain.links import Links, event_steps
from rankwatch.explain.steps import StepTable

LINK_GAP_NS = 2_000_000  # a metadata op this close before a launch still describes it
SHOWN = 10

_DTYPE_CANON = {
    "bf16": "bfloat16",
    "f32": "float",
    "float32": "float",
    "f16": "half",
    "float16": "half",
    "f64": "double",
    "float64": "double",
    "i32": "int",
    "int32": "int",
    "i64": "long",
    "int64": "long",
    "u8": "byte",
    "uint8": "byte",
    "i8": "char",
    "int8": "char",
}


@dataclass
class CommOp:
    rank: int
    event: int
    start: int
    end: int
    launch: int
    step: int
    meta: CollMeta
    key: tuple[Any, ...] = ()
    coll: int = -1

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class Collective:
    key: tuple[Any, ...]
    step: int
    ops: dict[int, CommOp]
    expected: tuple[int, ...]
    transfer_ns: int | None = None
    last_rank: int | None = None
    waits: dict[int, int] = field(default_factory=dict)

    @property
    def meta(self) -> CollMeta:
        return next(iter(self.ops.values())).meta

    def label(self) -> str:
        m = self.meta
        ident = f"seq {self.key[2]}" if self.key[1] == "seq" else f"#{self.key[3]} of step"
        return f"{m.name or m.family} ({ident}, group {self.key[0]})"


@dataclass
class CollectiveTable:
    ops: dict[int, list[CommOp]]
    colls: list[Collective]
    method: dict[str, str]
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    incomplete: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: int = 0


def _canon_dtype(dtype: str | None) -> str | None:
    if not dtype:
        return None
    low = dtype.lower()
    return _DTYPE_CANON.get(low, low)


def _merge(primary: CollMeta | None, fallback: CollMeta) -> CollMeta:
    """Args metadata where linked, completed from what the kernel name says."""
    if primary is None:
        return fallback
    family = primary.family if primary.family != "unknown" else fallback.family
    return replace(primary, family=family, dtype=primary.dtype or fallback.dtype)


class _MetaFinder:
    """Find the metadata op (record_param_comms, NCCL NVTX range) of a comm event."""

    def __init__(self, trace: RankTrace) -> None:
        self.t = trace
        idx = trace.select(Kind.COMM_CPU)
        self.by_ext = {int(trace.ext[i]): int(i) for i in idx if trace.ext[i] >= 0}
        self.by_track: dict[int, np.ndarray] = {}
        for track in np.unique(trace.track[idx]):
            self.by_track[int(track)] = idx[trace.track[idx] == track]

    def find(self, event: int, host_time: int, host_track: int) -> CollMeta | None:
        t = self.t
        ext = int(t.ext[event])
        if ext >= 0 and ext in self.by_ext:
            return t.colls[int(t.meta[self.by_ext[ext]])]
        cand = self.by_track.get(host_track)
        if cand is None or host_time < 0:
            return None
        pos = int(np.searchsorted(t.start[cand], host_time, side="right")) - 1
        if pos < 0:
            return None
        i = int(cand[pos])
        if t.end[i] >= host_time or host_time - t.end[i] <= LINK_GAP_NS:
            return t.colls[int(t.meta[i])]
        return None


def rank_comm_ops(trace: RankTrace, links: Links, steps: StepTable) -> list[CommOp]:
    """The rank's collective instances with their metadata, launch time and step."""
    gpu = trace.has_gpu
    idx = trace.select(Kind.COMM_KERNEL if gpu else Kind.COMM_HOST)
    if len(idx) == 0:
        return []
    launch = links.launch(idx) if gpu else np.full(len(idx), -1)
    host_time = np.where(launch >= 0, trace.start[np.clip(launch, 0, None)], trace.start[idx])
    host_track = np.where(launch >= 0, trace.track[np.clip(launch, 0, None)], trace.track[idx])
    step = event_steps(trace, links, steps.ranks[trace.rank], idx)
    finder = _MetaFinder(trace)
    ops = []
    for j, i in enumerate(idx):
        name = trace.names[int(trace.name[i])]
        own = trace.colls[int(trace.meta[i])] if trace.meta[i] >= 0 else None
        linked = own or finder.find(int(i), int(host_time[j]), int(host_track[j]))
        meta = _merge(linked, meta_from_kernel_name(name)) if gpu else (linked or CollMeta())
        ops.append(
            CommOp(
                trace.rank,
                int(i),
                int(trace.start[i]),
                int(trace.end[i]),
                int(host_time[j]),
                int(step[j]),
                meta,
            )
        )
    return ops


def _assign_keys(ops: dict[int, list[CommOp]]) -> dict[str, str]:
    """Key every op (see module doc); returns the matching method per group."""
    by_pg: dict[str, list[CommOp]] = defaultdict(list)
    for rank_ops in ops.values():
        for op in rank_ops:
            by_pg[op.meta.pg or "default"].append(op)
    method = {}
    for pg, pg_ops in by_pg.items():
        if all(op.meta.seq is not None for op in pg_ops):
            method[pg] = "Seq"
            for op in pg_ops:
                op.key = (pg, "seq", op.meta.seq, op.meta.family == "sendrecv")
        else:
            method[pg] = "order within step"
            counters: Counter[tuple[int, int]] = Counter()
            for op in sorted(pg_ops, key=lambda o: (o.rank, o.start)):
                k = (op.rank, op.step)
                op.key = (pg, "order", op.step, counters[k])
                counters[k] += 1
    return method


def _signature(meta: CollMeta) -> dict[str, Any]:
    sig = {
        "collective": meta.family,
        "in_nelems": meta.in_nelems,
        "out_nelems": meta.out_nelems,
        "dtype": _canon_dtype(meta.dtype),
        "bytes": meta.size_bytes,
    }
    return {k: v for k, v in sig.items() if v is not None and v != "unknown"}


def _disagree(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [k for k in a if k in b and a[k] != b[k]]


def _check(coll: Collective, table: CollectiveTable) -> None:
    sigs = {r: _signature(op.meta) for r, op in coll.ops.items()}
    votes = Counter(tuple(sorted(s.items())) for s in sigs.values())
    majority = dict(votes.most_common(1)[0][0])
    odd = {r: s for r, s in sigs.items() if _disagree(s, majority)}
    if odd:
        table.mismatches.append(
            {
                "collective": coll.label(),
                "step": coll.step,
                "expected": majority,
                "ranks": {str(r): s for r, s in odd.items()},
                "fields": sorted({f for s in odd.values() for f in _disagree(s, majority)}),
            }
        )
    missing = sorted(set(coll.expected) - set(coll.ops))
    if missing:
        table.incomplete.append(
            {"collective": coll.label(), "step": coll.step, "missing_ranks": missing}
        )


def _split(coll: Collective) -> None:
    """Transfer = shortest duration across ranks; wait = each rank's excess."""
    if len(coll.ops) < 2 or (coll.meta.family == "sendrecv" and coll.key[1] != "seq"):
        return
    durs = {r: op.dur for r, op in coll.ops.items()}
    last = min(durs, key=lambda r: (durs[r], r))
    coll.transfer_ns = durs[last]
    coll.last_rank = last
    coll.waits = {r: d - durs[last] for r, d in durs.items()}


def _expected(ops: list[CommOp], members: set[int]) -> tuple[int, ...]:
    for op in ops:
        if op.meta.pg_ranks:
            return tuple(r for r in op.meta.pg_ranks if r in members)
    return tuple(sorted(members))


def match(traces: list[RankTrace], links: dict[int, Links], steps: StepTable) -> CollectiveTable:
    """Find, match, check and split every rank's collectives."""
    ops = {t.rank: rank_comm_ops(t, links[t.rank], steps) for t in traces}
    method = _assign_keys(ops)
    table = CollectiveTable(ops, [], method)
    groups: dict[tuple[Any, ...], list[CommOp]] = defaultdict(list)
    for rank_ops in ops.values():
        for op in rank_ops:
            groups[op.key].append(op)
    members: dict[str, set[int]] = defaultdict(set)
    for key, group in groups.items():
        members[key[0]].update(op.rank for op in group)
    for key, group in groups.items():
        by_rank: dict[int, CommOp] = {}
        for op in group:
            by_rank.setdefault(op.rank, op)
        step = Counter(op.step for op in group).most_common(1)[0][0]
        coll = Collective(key, step, by_rank, _expected(group, members[key[0]]))
        for op in by_rank.values():
            op.coll = len(table.colls)
        table.colls.append(coll)
        _check(coll, table)
        _split(coll)
    table.checked = sum(1 for c in table.colls if len(c.ops) > 1)
    _notes(table)
    return table


def _notes(table: CollectiveTable) -> None:
    unlinked = sum(1 for ops in table.ops.values() for op in ops if op.meta.source == "kernel name")
    if unlinked:
        table.notes.append(
            f"{unlinked} collective op(s) carry no collective args (older traces): "
            "matched by order, checked by kernel name only"
        )
    if table.incomplete:
        table.notes.append(
            f"{len(table.incomplete)} collective(s) are missing on some ranks; their "
            "transfer/wait split uses the ranks present"
        )


def summary(table: CollectiveTable) -> dict[str, Any]:
    by_family = Counter(c.meta.family for c in table.colls)
    return {
        "collectives": len(table.colls),
        "matched_on_several_ranks": table.checked,
        "by_collective": dict(by_family),
        "matching": table.method,
        "mismatches": len(table.mismatches),
        "mismatch_examples": table.mismatches[:SHOWN],
        "incomplete": len(table.incomplete),
        "incomplete_examples": table.incomplete[:SHOWN],
        "notes": table.notes,
    }
