"""Op records of a simulated job, in exactly the plugin's line format.

Each (rank, phase, part) gets one %-template with its constant fields baked in;
a chunk of steps is then formatted column-wise from numpy arrays converted to
Python lists, which is what makes millions of lines a second affordable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from rankwatch import __version__
from rankwatch.simulate.clocks import ClockModel
from rankwatch.simulate.fastfmt import LineFormat
from rankwatch.simulate.timeline import Chunk, PhaseTimes
from rankwatch.simulate.topology import DTYPE_SIZE, Layout, Phase

NCHANNELS = 8
DRAIN_NS = 20_000_000  # the plugin writes completed ops at least this often


def _js(value: str) -> str:
    """A JSON string literal, safe inside a %-template."""
    return json.dumps(value).replace("%", "%%")


@dataclass(frozen=True)
class Slot:
    """One op a rank issues per step: a phase, and for p2p which side (recv/send)."""

    phase_index: int
    part: str  # coll, send or recv
    func: str
    seq_per_step: int  # ops with the same (comm, func / direction) per step
    seq_in_step: int
    peer: int | None  # rank in the communicator of the p2p peer
    peer_global: int | None


def _bus_factor(func: str, n: int) -> tuple[float, float]:
    """(traffic multiplier on msg size, bus factor) as nccl-tests defines them."""
    if func == "AllReduce":
        return 1.0, 2.0 * (n - 1) / n if n > 1 else 0.0
    if func in ("AllGather", "ReduceScatter"):
        return float(n), (n - 1.0) / n if n > 1 else 0.0
    return 1.0, 1.0


def _header(layout: Layout, rank: int, kind: str) -> str:
    comm = layout.comm_of(kind, rank)
    pos = int(layout.comm_rank[kind][rank])
    host = layout.hostnames[int(layout.host_of[rank])]
    return (
        f'{{"header":{{"id":"{comm.id_str}","comm_name":{_js(comm.name)},"rank":{pos},'
        f'"n_ranks":{len(comm.ranks)},"nnodes":{comm.nnodes}}},'
        f'"metadata":{{"inspector_output_format_version":"v4.0",'
        f'"git_rev":"rankwatch-{__version__}","rec_mechanism":"nccl_profiler_interface",'
        f'"dump_timestamp_us":%d,"hostname":{_js(host)},"pid":{int(layout.pids[rank])}}}'
    )


_TIMES = (
    '"graph_captured":false,"api_start_ns":%d,"api_end_ns":%d,"enqueue_start_ns":%d,'
    '"enqueue_end_ns":%d,"arrival_ns":%d,"gpu_start_ns":%d,"gpu_end_ns":%d,'
    '"gpu_start_raw_ns":%d,"gpu_end_raw_ns":%d,"clock_offset_ns":{off},"clock_error_ns":{err},'
    '"exec_time_ns":%d,"gpu_timed":true,"gpu_start_stale":false,"channels_started":{ch},'
    '"channels_stopped":{ch},'
    '"complete":true}}}}\n'
)


def template(
    layout: Layout,
    rank: int,
    phase: Phase,
    slot: Slot,
    clocks: ClockModel,
    job_id: str,
    func: str | None = None,
) -> str:
    """The %-template of one slot's record line (15 or 16 variable fields)."""
    func = func or slot.func
    coll = slot.part == "coll"
    if coll:
        perf = (
            f'"coll_perf":{{"coll":"{func}","coll_sn":%d,"coll_msg_size_bytes":%d,'
            '"coll_exec_time_us":%d,"coll_timing_source":"kernel_gpu",'
            '"coll_algobw_gbs":%.6f,"coll_busbw_gbs":%.6f}'
        )
        tail = f'"root":0,"peer":null,"algo":"RING","proto":"SIMPLE","nchannels":{NCHANNELS},'
    else:
        perf = (
            f'"p2p_perf":{{"p2p":"{func}","p2p_sn":%d,"p2p_peer":{slot.peer},'
            '"p2p_msg_size_bytes":%d,"p2p_exec_time_us":%d,"p2p_timing_source":"kernel_gpu",'
            '"p2p_algobw_gbs":%.6f,"p2p_busbw_gbs":%.6f}'
        )
        tail = f'"root":null,"peer":{slot.peer},"algo":null,"proto":null,"nchannels":1,'
    ext = (
        f',"rankwatch":{{"schema":1,"kind":"{"coll" if coll else "p2p"}","job_id":'
        f'{_js(job_id)},"device":{rank % 8},"func":"{func}","seq":%d,'
        f'"datatype":"{phase.dtype}","count":%d,"msg_size_bytes":%d,'
    )
    times = _TIMES.format(
        off=int(clocks.gpu_offset_ns[rank] + clocks.gpu_est_error_ns[rank]),
        err=int(clocks.gpu_error_ns[rank]),
        ch=NCHANNELS if coll else 1,
    )
    return _header(layout, rank, phase.comm) + "," + perf + ext + tail + times


def _p2p_sides(layout: Layout, phase: Phase, rank: int) -> list[tuple[str, int]]:
    """(part, peer global rank) of the p2p ops `rank` issues in a phase: recv, then send."""
    stride = layout.cfg.tp * layout.cfg.dp_size
    stage, last = int(layout.comm_rank["pp"][rank]), layout.cfg.pp - 1
    nxt = rank + stride if stage < last else None
    prv = rank - stride if stage > 0 else None
    recv_from, send_to = (prv, nxt) if phase.p2p_dir > 0 else (nxt, prv)
    sides = []
    if recv_from is not None:
        sides.append(("recv", recv_from))
    if send_to is not None:
        sides.append(("send", send_to))
    return sides


def rank_slots(layout: Layout, phases: list[Phase], rank: int) -> list[Slot]:
    """Every op `rank` issues in one step, in issue order."""
    per_step: dict[tuple, int] = {}
    for p in phases:
        key = (p.comm, p.func) if not p.p2p_dir else (p.comm, p.p2p_dir)
        per_step[key] = per_step.get(key, 0) + 1
    seen: dict[tuple, int] = {}
    slots = []
    for i, p in enumerate(phases):
        key = (p.comm, p.func) if not p.p2p_dir else (p.comm, p.p2p_dir)
        index = seen.get(key, 0)
        seen[key] = index + 1
        if not p.p2p_dir:
            slots.append(Slot(i, "coll", p.func, per_step[key], index, None, None))
            continue
        for part, peer in _p2p_sides(layout, p, rank):
            func = "Recv" if part == "recv" else "Send"
            peer_pos = int(layout.comm_rank["pp"][peer])
            slots.append(Slot(i, part, func, per_step[key], index, peer_pos, peer))
    return slots


@dataclass
class SlotColumns:
    """One slot's values over the valid steps of a chunk, as int64/float64 arrays."""

    steps: np.ndarray
    api: np.ndarray
    enq_s: np.ndarray
    enq_e: np.ndarray
    gpu_s: np.ndarray
    gpu_e: np.ndarray


def slot_columns(
    pt: PhaseTimes, slot: Slot, rank: int, host: int, first_step: int, clocks: ClockModel
) -> SlotColumns:
    end = (pt.recv_end if slot.part == "recv" else pt.end)[:, rank]
    valid = np.flatnonzero(np.isfinite(end) & np.isfinite(pt.gpu_start[:, rank]))
    est = int(clocks.gpu_est_error_ns[rank])

    def local(a: np.ndarray) -> np.ndarray:
        return clocks.host_local(host, a[valid, rank] if a.ndim == 2 else a[valid])

    return SlotColumns(
        steps=first_step + valid,
        api=local(pt.api_start),
        enq_s=local(pt.enq_start),
        enq_e=local(pt.enq_end),
        gpu_s=local(pt.gpu_start) + est,
        gpu_e=local(end) + est,
    )


@dataclass
class RankContext:
    """What formatting one rank's records needs, built once per rank."""

    rank: int
    host: int
    slots: list[Slot]
    templates: list[str]
    formats: list[LineFormat]
    p2p_index: list[int]  # per slot: position among the rank's p2p ops of a step (-1: coll)
    p2p_per_step: int
    n_in_comm: list[int]  # per slot: ranks in the slot's communicator
    gpu_offset: int  # clock_offset_ns the records carry (the plugin's estimate)


def rank_context(layout: Layout, phases: list[Phase], rank: int, clocks: ClockModel) -> RankContext:
    slots = rank_slots(layout, phases, rank)
    job = layout.cfg.job_id
    templates = [template(layout, rank, phases[s.phase_index], s, clocks, job) for s in slots]
    p2p_index, k = [], 0
    for s in slots:
        p2p_index.append(k if s.part != "coll" else -1)
        k += s.part != "coll"
    sizes = [len(layout.comm_of(phases[s.phase_index].comm, rank).ranks) for s in slots]
    host = int(layout.host_of[rank])
    offset = int(clocks.gpu_offset_ns[rank] + clocks.gpu_est_error_ns[rank])
    formats = [LineFormat(t) for t in templates]
    return RankContext(rank, host, slots, templates, formats, p2p_index, k, sizes, offset)


def slot_lines(
    ctx: RankContext,
    j: int,
    phase: Phase,
    cols: SlotColumns,
    drain: np.ndarray,
    seq_shift: np.ndarray | int = 0,
) -> list[memoryview]:
    """Record lines of slot j for the chunk's valid steps."""
    slot = ctx.slots[j]
    seq = cols.steps * slot.seq_per_step + slot.seq_in_step + seq_shift
    sn = seq if slot.part == "coll" else cols.steps * ctx.p2p_per_step + ctx.p2p_index[j]
    exec_ns = cols.gpu_e - cols.gpu_s
    traffic, factor = _bus_factor(slot.func, ctx.n_in_comm[j])
    if slot.part != "coll":
        traffic, factor = 1.0, 1.0
    algbw = phase.msg_bytes * traffic / np.maximum(exec_ns, 1)
    n = len(seq)
    count, msg = np.full(n, phase.count), np.full(n, phase.msg_bytes)
    # In template order: dump_timestamp_us, sn, msg, exec us, algbw, busbw, seq, count,
    # msg, api start/end, enqueue start/end, arrival, gpu start/end, raw start/end, exec ns
    values = [(cols.gpu_e + drain[:n]) // 1000, sn, msg, exec_ns // 1000, algbw,
              algbw * factor, seq, count, msg, cols.api, cols.enq_e + 1000, cols.enq_s,
              cols.enq_e, cols.api, cols.gpu_s, cols.gpu_e, cols.gpu_s - ctx.gpu_offset,
              cols.gpu_e - ctx.gpu_offset, exec_ns]  # fmt: skip
    return ctx.formats[j].render(values)


@dataclass(frozen=True)
class DesyncPlan:
    """Where the desync fault lands: rank, step, and the phase of the mismatched op."""

    rank: int
    step: int
    kind: str  # size or func
    phase_index: int
    comm: str

    @classmethod
    def of(cls, layout: Layout, phases: list[Phase]) -> DesyncPlan | None:
        fault = layout.cfg.desync
        if fault is None:
            return None
        dp_kind = "dp" if "dp" in layout.comms else "world"
        index = next(i for i, p in enumerate(phases) if p.comm == dp_kind)
        return cls(fault.rank, fault.at_step, fault.kind, index, dp_kind)

    def seq_shift(self, rank: int, slot: Slot, comm: str, steps: np.ndarray) -> np.ndarray | int:
        """After a func desync the rank's AllReduce counter on that comm is one behind."""
        if self.kind != "func" or rank != self.rank or comm != self.comm:
            return 0
        if slot.func != "AllReduce":
            return 0
        later = (steps > self.step) | ((steps == self.step) & (slot.phase_index > self.phase_index))
        return -later.astype(np.int64)

    def patch(self, rank: int, slot: Slot, phase: Phase, steps: np.ndarray, lines: list) -> None:
        if rank != self.rank or slot.phase_index != self.phase_index:
            return
        hit = np.flatnonzero(steps == self.step)
        if not len(hit):
            return
        i = int(hit[0])
        if self.kind == "size":
            count = phase.count // 2
            msg = count * DTYPE_SIZE[phase.dtype]
            swaps = [
                (f'"coll_msg_size_bytes":{phase.msg_bytes},', f'"coll_msg_size_bytes":{msg},'),
                (
                    f'"count":{phase.count},"msg_size_bytes":{phase.msg_bytes},',
                    f'"count":{count},"msg_size_bytes":{msg},',
                ),
            ]
        else:
            seq = int(steps[i]) * slot.seq_per_step + slot.seq_in_step
            swaps = [
                ('"coll":"AllReduce"', '"coll":"AllGather"'),
                ('"func":"AllReduce"', '"func":"AllGather"'),
                (f'"coll_sn":{seq},', '"coll_sn":0,'),
                (f'"seq":{seq},', '"seq":0,'),
            ]
        line = bytes(lines[i])
        for old, new in swaps:
            line = line.replace(old.encode(), new.encode())
        lines[i] = line


def rank_chunk_lines(
    ctx: RankContext,
    chunk: Chunk,
    phases: list[Phase],
    clocks: ClockModel,
    rng: np.random.Generator,
    desync: DesyncPlan | None,
) -> tuple[list, int]:
    """All op-record lines (bytes-like) of one rank for one chunk, in issue order,
    and how many of them are p2p records."""
    lines: list = []
    p2p = 0
    keys: list[np.ndarray] = []
    width = len(ctx.slots)
    for j, slot in enumerate(ctx.slots):
        phase = phases[slot.phase_index]
        cols = slot_columns(
            chunk.phases[slot.phase_index], slot, ctx.rank, ctx.host, chunk.first_step, clocks
        )
        if not len(cols.steps):
            continue
        drain = rng.integers(0, DRAIN_NS, len(cols.steps))
        shift = desync.seq_shift(ctx.rank, slot, phase.comm, cols.steps) if desync else 0
        out = slot_lines(ctx, j, phase, cols, drain, shift)
        if desync is not None:
            desync.patch(ctx.rank, slot, phase, cols.steps, out)
        lines += out
        p2p += len(out) if slot.part != "coll" else 0
        keys.append(cols.steps * width + j)
    if not keys:
        return [], 0
    order = np.argsort(np.concatenate(keys), kind="stable")
    return [lines[i] for i in order.tolist()], p2p
