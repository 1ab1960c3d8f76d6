"""Perfetto timeline of an aligned run: `write_perfetto(run, path)`.

Format: Perfetto's native protobuf trace (`.pftrace`), written with the `perfetto`
PyPI package's generated `TracePacket` classes (pure Python over `protobuf`, no
binary download, works offline); each packet is framed as one `Trace.packet`
field, exactly as the package's `StreamingTraceProtoBuilder` does, minus its
per-packet wrapper object (a third of the writing time). Protobuf was chosen over
Chrome trace-event JSON because it is several times smaller (no repeated key
names, varint timestamps), keeps nanosecond timestamps exact (JSON has
microsecond floats, which lose the last digits of epoch-ns times), has real tracks
with parents (host, rank, lanes) instead of pid/tid conventions, and is written
packet by packet. ui.perfetto.dev opens the file directly (nothing is uploaded).
`perfetto.trace_processor` is not used: it downloads a binary at first use.

Layout:
 - one process track per host (pid 1..H, named after the host);
 - one thread track per rank, named "rank N (host, pid)", N the world rank;
   it holds one slice per GPU-timed op over its GPU span [gpu_start_c, gpu_end_c],
   named after the NCCL function, with args seq, size_bytes, comm, algo/proto,
   bus bandwidth (the rank's own, from its record), peer for P2P ops;
   ops of different communicators that overlap on the GPU go to child tracks
   "GPU overlap K" (slices on one track must nest);
 - per rank a child track "host enqueue": the host side of every op, from the
   rank's arrival (API call) to the end of NCCL's enqueue;
 - flows: the slices of one collective (communicator, function, sequence
   number) on all its ranks share a flow, in time order, so selecting one rank's
   AllReduce shows its peers; a Send and its matching Recv share one too. The
   GPU slice carries the flow, or the host slice when the op has no GPU timing.
All times are on the clock-corrected timeline of `ops_aligned` (reference host's
clock, ns since the Unix epoch), so several exports line up.

Huge jobs: at most `max_ops` op records are drawn (default 200,000: about
400,000 slices and 60 MB, which the UI loads comfortably; writing them takes
7 to 13 s and some 300 MB on a 2-core machine, whatever the job's size). Above
that, whole collective / P2P instances are kept at a fixed stride (every k-th, in
sequence order per communicator and function), so every kept collective still
has all its ranks and flows and the whole job's span is covered. The trace then has a
"rankwatch" track whose first instant event carries a note saying so; the note is
also returned.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from rankwatch.align.clock import correction_sql
from rankwatch.model import Run

DEFAULT_MAX_OPS = 200_000
SEQUENCE_ID = 1

# One row per drawn op; `inst` numbers the collective / P2P instance it belongs to.
_OPS_SQL = """
WITH o AS (
    SELECT o.world_rank, o.host, o.pid, o.kind, o.func, o.seq, o.comm_key, o.comm_id,
           o.comm_name, o.rank, o.peer, o.msg_bytes, o.algo, o.proto, o.busbw_gbs,
           o.arrival_c, {enqueue_end} AS enqueue_end_c, o.gpu_start_c, o.gpu_end_c,
           CASE WHEN o.kind = 'p2p' AND o.func = 'Recv' THEN o.peer ELSE o.rank END AS sender,
           CASE WHEN o.kind = 'p2p' AND o.func = 'Recv' THEN o.rank ELSE o.peer END AS receiver
    FROM ops_aligned o LEFT JOIN host_clock c ON c.host = o.host
    WHERE o.world_rank IS NOT NULL
), keyed AS (
    SELECT *, dense_rank() OVER (
        ORDER BY comm_key, kind, CASE WHEN kind = 'coll' THEN func END,
                 CASE WHEN kind = 'p2p' THEN sender END,
                 CASE WHEN kind = 'p2p' THEN receiver END, seq) AS inst
    FROM o
)
SELECT world_rank, kind, func, seq, comm_key, comm_id, comm_name, rank, peer, msg_bytes,
       algo, proto, busbw_gbs, arrival_c, enqueue_end_c, gpu_start_c, gpu_end_c, inst
FROM keyed WHERE inst % ? = 0
"""

_RANKS_SQL = """
SELECT p.world_rank, p.host, p.pid FROM processes p ORDER BY p.host, p.world_rank
"""


@dataclass
class PerfettoExport:
    """What write_perfetto wrote."""

    path: str
    ranks: int = 0
    hosts: int = 0
    gpu_slices: int = 0
    host_slices: int = 0
    flows: int = 0
    ops_total: int = 0
    ops_drawn: int = 0
    stride: int = 1
    notes: list[str] = field(default_factory=list)


@dataclass
class _Tracks:
    """Track uuids: per host, per rank, and the per-rank child tracks made on demand."""

    host: dict[str, int] = field(default_factory=dict)
    rank: dict[int, int] = field(default_factory=dict)
    children: dict[tuple[int, str], int] = field(default_factory=dict)
    next_uuid: int = 1

    def new(self) -> int:
        self.next_uuid += 1
        return self.next_uuid


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Writer:
    """Writes TracePackets (the perfetto package's generated class) to a binary stream,
    each framed as field 1 of `Trace` (tag 0x0A, length, packet)."""

    def __init__(self, stream: Any) -> None:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2

        self.pb = perfetto_trace_pb2
        self.stream = stream
        self.first = True

    def packet(self) -> Any:
        pkt = self.pb.TracePacket()
        pkt.trusted_packet_sequence_id = SEQUENCE_ID
        if self.first:
            pkt.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        return pkt

    def descriptor(self, uuid: int, name: str, parent: int | None = None) -> Any:
        pkt = self.packet()
        desc = pkt.track_descriptor
        desc.uuid = uuid
        desc.name = name
        if parent is not None:
            desc.parent_uuid = parent
        return pkt, desc

    def write(self, pkt: Any) -> None:
        data = pkt.SerializeToString()
        self.stream.write(b"\x0a" + _varint(len(data)) + data)


def _describe_tracks(w: _Writer, ranks: list[tuple], tracks: _Tracks) -> None:
    """One process track per host, one thread track per rank (tid unique per rank)."""
    host_pid = {host: i + 1 for i, host in enumerate(dict.fromkeys(h for _, h, _ in ranks))}
    for host, h in host_pid.items():
        uuid = tracks.new()
        tracks.host[host] = uuid
        pkt, desc = w.descriptor(uuid, host)
        desc.process.pid = h
        desc.process.process_name = host
        w.write(pkt)
    for world_rank, host, pid in ranks:
        uuid = tracks.new()
        tracks.rank[world_rank] = uuid
        pkt, desc = w.descriptor(uuid, f"rank {world_rank} ({host}, {pid})")
        desc.thread.pid = host_pid[host]
        desc.thread.tid = len(host_pid) + 1 + world_rank
        desc.thread.thread_name = desc.name
        w.write(pkt)


def _child(w: _Writer, tracks: _Tracks, world_rank: int, name: str) -> int:
    key = (world_rank, name)
    if key not in tracks.children:
        uuid = tracks.new()
        tracks.children[key] = uuid
        pkt, _ = w.descriptor(uuid, name, parent=tracks.rank[world_rank])
        w.write(pkt)
    return tracks.children[key]


def _lanes(spans: list[tuple[int, int]]) -> list[int]:
    """Greedy lane per span (spans sorted by start): the first lane free by its start."""
    ends: list[int] = []
    out = []
    for start, end in spans:
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        out.append(lane)
    return out


# Event tuples: (ts, is_begin, (world_rank, child track name or ""), op, is_gpu, flow?)
GPU, HOST = True, False


def _track_events(spans: list[tuple], world_rank: int, gpu: bool, timed: set[int]) -> list:
    """Per rank and side, events in per-track order: overlapping spans go to lanes, and
    on each lane begins and ends alternate. The flow rides the GPU slice, or the host
    slice of an op without one."""
    events: list[tuple] = []
    for (start, end, op), lane in zip(spans, _lanes([s[:2] for s in spans]), strict=True):
        if gpu:
            name = "" if lane == 0 else f"GPU overlap {lane}"
        else:
            name = "host enqueue" if lane == 0 else f"host enqueue {lane + 1}"
        flow = gpu or id(op) not in timed
        events.append((start, True, (world_rank, name), op, gpu, flow))
        events.append((end, False, (world_rank, name), None, gpu, False))
    return events


def _rank_events(world_rank: int, rank_ops: list[Any]) -> list[tuple]:
    gpu = [(o.gpu_start_c, o.gpu_end_c, o) for o in rank_ops
           if o.gpu_start_c is not None and o.gpu_end_c is not None]  # fmt: skip
    gpu.sort(key=itemgetter(0, 1))
    host = [(o.arrival_c, max(o.enqueue_end_c or o.arrival_c, o.arrival_c), o)
            for o in rank_ops if o.arrival_c is not None]  # fmt: skip
    host.sort(key=itemgetter(0, 1))
    timed = {id(o) for _, _, o in gpu}
    return _track_events(gpu, world_rank, GPU, timed) + _track_events(host, world_rank, HOST, timed)


def _slices(ops: list[Any]) -> list[tuple]:
    """All slice events in time order; a stable sort of the per-track runs keeps each
    track's own order where timestamps tie (an end, then the next begin)."""
    by_rank: dict[int, list[Any]] = {}
    for op in ops:
        by_rank.setdefault(op.world_rank, []).append(op)
    events: list[tuple] = []
    for world_rank, rank_ops in by_rank.items():
        events += _rank_events(world_rank, rank_ops)
    events.sort(key=itemgetter(0))
    return events


def _flow_ends(events: list[tuple]) -> dict[int, int]:
    """Per instance with several slices: the index of its last flow-carrying event."""
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    for i, event in enumerate(events):
        if event[5]:
            inst = event[3].inst
            last[inst] = i
            count[inst] = count.get(inst, 0) + 1
    return {inst: i for inst, i in last.items() if count[inst] > 1}


def _annotate_gpu(ev: Any, op: Any) -> None:
    add = ev.debug_annotations.add
    a = add()
    a.name, a.int_value = "seq", op.seq
    if op.msg_bytes is not None:
        a = add()
        a.name, a.int_value = "size_bytes", op.msg_bytes
    a = add()
    a.name, a.string_value = "comm", f"{op.comm_name or ''} {op.comm_id}".strip()
    a = add()
    a.name, a.int_value = "comm_rank", op.rank
    if op.kind == "p2p" and op.peer is not None:
        a = add()
        a.name, a.int_value = "peer", op.peer
    if op.algo or op.proto:
        a = add()
        a.name, a.string_value = "algo_proto", "/".join(x for x in (op.algo, op.proto) if x)
    if op.busbw_gbs is not None:
        a = add()
        a.name, a.double_value = "busbw_gbs", op.busbw_gbs


def _annotate_host(ev: Any, op: Any, end: int) -> None:
    add = ev.debug_annotations.add
    a = add()
    a.name, a.int_value = "seq", op.seq
    a = add()
    a.name, a.string_value = "comm", f"{op.comm_name or ''} {op.comm_id}".strip()
    a = add()
    a.name, a.int_value = "enqueue_ns", end - op.arrival_c


def _emit(w: _Writer, events: list[tuple], tracks: _Tracks, result: PerfettoExport) -> None:
    te = w.pb.TrackEvent
    ends = _flow_ends(events)
    terminal = set(ends.values())
    result.flows = len(ends)
    for i, (ts, begin, (world_rank, name), op, gpu, flow) in enumerate(events):
        pkt = w.packet()
        pkt.timestamp = ts
        ev = pkt.track_event
        ev.track_uuid = tracks.rank[world_rank] if not name else _child(w, tracks, world_rank, name)
        if not begin:
            ev.type = te.TYPE_SLICE_END
            w.write(pkt)
            continue
        ev.type = te.TYPE_SLICE_BEGIN
        ev.name = op.func or "unknown"
        if gpu:
            _annotate_gpu(ev, op)
            result.gpu_slices += 1
        else:
            _annotate_host(ev, op, _host_end(op))
            result.host_slices += 1
        if flow and op.inst in ends:
            (ev.terminating_flow_ids if i in terminal else ev.flow_ids).append(op.inst)
        w.write(pkt)


def _host_end(op: Any) -> int:
    return max(op.enqueue_end_c or op.arrival_c, op.arrival_c)


def _note(w: _Writer, tracks: _Tracks, ts: int, text: str) -> None:
    uuid = tracks.new()
    pkt, _ = w.descriptor(uuid, "rankwatch")
    w.write(pkt)
    pkt = w.packet()
    pkt.timestamp = ts
    ev = pkt.track_event
    ev.type = w.pb.TrackEvent.TYPE_INSTANT
    ev.track_uuid = uuid
    ev.name = "note"
    a = ev.debug_annotations.add()
    a.name, a.string_value = "note", text
    w.write(pkt)


def _select(run: Run, max_ops: int) -> tuple[list[Any], int, int]:
    total = int(run.con.execute("SELECT count(*) FROM ops").fetchall()[0][0])
    stride = max(1, math.ceil(total / max_ops)) if max_ops > 0 else 1
    cursor = run.con.execute(
        _OPS_SQL.format(enqueue_end=correction_sql("o.enqueue_end_ns")), [stride]
    )
    op = namedtuple("Op", [d[0] for d in cursor.description])
    return [op._make(row) for row in cursor.fetchall()], total, stride


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The export makes millions of small tuples and messages, none of them in a
    reference cycle (reference counting frees them all), and Python's cyclic
    collector would scan the growing heap of them again and again: about half the
    time of building the event list. It is paused while the trace is built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def write_perfetto(
    run: Run, path: str | os.PathLike[str], max_ops: int = DEFAULT_MAX_OPS
) -> PerfettoExport:
    """Write the run's timeline to `path` (Perfetto protobuf); see the module doc.

    Needs the tables align() makes (ops_aligned, processes, host_clock). The file
    is written to a temporary name next to `path` and renamed when complete.
    """
    with _cyclic_gc_paused():
        return _write(run, Path(path), max_ops)


def _write(run: Run, out: Path, max_ops: int) -> PerfettoExport:
    ops, total, stride = _select(run, max_ops)
    ranks = [tuple(r) for r in run.con.execute(_RANKS_SQL).fetchall()]
    result = PerfettoExport(str(out), len(ranks), len({r[1] for r in ranks}))
    result.ops_total, result.ops_drawn, result.stride = total, len(ops), stride
    if stride > 1:
        result.notes.append(
            f"{total:,} op records exceed the limit of {max_ops:,}: drew every {stride}th "
            f"collective / P2P instance ({len(ops):,} op records), each with all its ranks"
        )
    events = _slices(ops)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as stream:
            w = _Writer(stream)
            tracks = _Tracks()
            _describe_tracks(w, ranks, tracks)
            if result.notes:
                _note(w, tracks, events[0][0] if events else 0, result.notes[0])
            _emit(w, events, tracks, result)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return result
