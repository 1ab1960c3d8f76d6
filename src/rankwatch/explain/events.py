"""The normalised event table: what every trace reader (Kineto JSON, Nsight SQLite)
produces for one rank, whatever the source's schema version.

Events are columns (numpy arrays), not objects: a 1 GB trace holds millions of
events, and a Python object per event would need many times the file's size.
Names are interned per rank (`names[name_id]`). Times are integer nanoseconds on
the rank's own clock (Unix epoch where the trace says so).
"""

from __future__ import annotations

import gc
import re
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from rankwatch.model import Problem


class Kind(IntEnum):
    KERNEL = 0  # GPU kernel that is not communication
    COMM_KERNEL = 1  # NCCL/RCCL kernel (by name or by collective args)
    MEMCPY = 2
    MEMSET = 3
    CPU_OP = 4  # aten ops and other host operators
    ANNOTATION = 5  # record_function / NVTX ranges on a host thread
    GPU_ANNOTATION = 6  # the same ranges projected onto a GPU stream
    RUNTIME = 7  # CUDA runtime / driver calls (launches carry a correlation id)
    INPUT = 8  # host ranges that wait for input data (DataLoader)
    COMM_CPU = 9  # host op carrying collective metadata (record_param_comms, NCCL NVTX)
    COMM_HOST = 10  # host range that *is* the collective in CPU-only traces (gloo:...)
    MODULE = 11  # nn.Module python_function ranges


GPU_KINDS = (Kind.KERNEL, Kind.COMM_KERNEL, Kind.MEMCPY, Kind.MEMSET)

# Step markers: ProfilerStep#N from torch.profiler, or NVTX ranges such as
# "step 12", "train_step_12", "iteration 12".
DEFAULT_STEP_PATTERN = (
    r"^(?:ProfilerStep\s*#\s*|(?:train[_ ]?)?(?:step|iteration|iter)[\s_#:=-]*)(\d+)\b"
)
# Host ranges that mean "waiting for the next batch".
DEFAULT_INPUT_PATTERN = r"enumerate\(DataLoader\)|DataLoader.*__next__|^data[_ ]?load"

# Size in bytes of the dtype names PyTorch writes into collective args, and of the
# short names NCCL kernel names carry.
DTYPE_BYTES: dict[str, int] = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "double": 8,
    "float64": 8,
    "f64": 8,
    "int": 4,
    "int32": 4,
    "i32": 4,
    "long": 8,
    "int64": 8,
    "i64": 8,
    "short": 2,
    "int16": 2,
    "byte": 1,
    "uint8": 1,
    "u8": 1,
    "char": 1,
    "int8": 1,
    "i8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "complexfloat": 8,
    "uint32": 4,
    "u32": 4,
    "uint64": 8,
    "u64": 8,
}

_FAMILIES = (
    ("reducescatter", ("reducescatter", "reduce_scatter")),
    ("allreduce", ("allreduce", "all_reduce")),
    ("allgather", ("allgather", "all_gather")),
    ("alltoall", ("alltoall", "all_to_all")),
    ("broadcast", ("broadcast", "bcast")),
    ("sendrecv", ("sendrecv", "send", "recv", "p2p")),
    ("barrier", ("barrier",)),
    ("reduce", ("reduce",)),
    ("gather", ("gather",)),
    ("scatter", ("scatter",)),
)


def family(name: str | None) -> str:
    """The collective family of a collective or kernel name ('unknown' if none)."""
    low = (name or "").lower().replace(" ", "")
    for fam, needles in _FAMILIES:
        if any(n in low for n in needles):
            return fam
    return "unknown"


_KERNEL_NAME = re.compile(
    r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)(?:_([A-Za-z]+))?(?:_([A-Za-z0-9]+))?", re.I
)


def meta_from_kernel_name(name: str) -> CollMeta:
    """What an NCCL kernel name alone says: the function and, often, the dtype
    (ncclDevKernel_AllReduce_Sum_bf16_RING_LL -> allreduce, bf16)."""
    m = _KERNEL_NAME.match(name)
    func = m.group(1) if m else name
    dtype = None
    if m:
        for part in (m.group(3), m.group(2)):
            if part and part.lower() in DTYPE_BYTES:
                dtype = part.lower()
                break
    return CollMeta(name=func.lower(), family=family(func), dtype=dtype, source="kernel name")


@dataclass
class CollMeta:
    """A collective as one rank's trace describes it (fields the trace lacks are None)."""

    name: str | None = None
    family: str = "unknown"
    pg: str | None = None
    pg_desc: str | None = None
    pg_ranks: tuple[int, ...] | None = None
    group_size: int | None = None
    seq: int | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    peer: int | None = None  # p2p source/destination rank
    size_bytes: int | None = None  # when the source states bytes, not elements (NCCL NVTX)
    source: str = "unknown"  # kernel args, cpu op, kernel name, nvtx

    def nbytes(self) -> int | None:
        """Message bytes in nccl-tests terms (total array for gather/scatter kinds)."""
        if self.size_bytes is not None:
            return self.size_bytes
        size = DTYPE_BYTES.get((self.dtype or "").lower())
        if size is None:
            return None
        if self.family == "allgather":
            n = self.out_nelems
        elif self.family == "reducescatter":
            n = self.in_nelems
        else:
            n = self.in_nelems if self.in_nelems is not None else self.out_nelems
        return None if n is None else int(n) * size

    def signature(self) -> tuple[Any, ...]:
        """What must agree across ranks for one collective."""
        dtype = (self.dtype or "").lower() or None
        return (self.family, self.in_nelems, self.out_nelems, dtype, self.size_bytes)


@dataclass
class Track:
    gpu: bool
    pid: Any
    tid: Any
    label: str


@dataclass
class StepRange:
    number: int
    start: int
    end: int
    track: int
    name: str


@dataclass
class RankTrace:
    """One rank's normalised trace (see module doc). Event arrays share one order:
    sorted by start time."""

    path: str
    fmt: str  # kineto | nsys
    rank: int | None
    rank_source: str  # distributedInfo, file name, order of files, ...
    host: str | None
    world_size: int | None
    names: list[str]
    kind: np.ndarray  # int8 Kind
    name: np.ndarray  # int32 -> names
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    track: np.ndarray  # int32 -> tracks
    corr: np.ndarray  # int64 correlation id (runtime <-> GPU), -1 if none
    ext: np.ndarray  # int64 External id (op <-> runtime <-> kernel), -1 if none
    meta: np.ndarray  # int32 -> colls, -1 if none
    flops: np.ndarray  # float64 FLOPs the profiler counted for the op, 0 if none
    tracks: list[Track]
    colls: list[CollMeta]
    steps: list[StepRange]
    gpu_name: str | None = None
    schema: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return bool(np.isin(self.kind, [int(k) for k in GPU_KINDS]).any())

    def select(self, *kinds: Kind) -> np.ndarray:
        """Indices of the events of these kinds, in start order."""
        return np.flatnonzero(np.isin(self.kind, [int(k) for k in kinds]))


class EventBuilder:
    """Appends events column by column while a reader streams its source."""

    def __init__(self) -> None:
        self.kind = array("b")
        self.name = array("i")
        self.start = array("q")
        self.end = array("q")
        self.track = array("i")
        self.corr = array("q")
        self.ext = array("q")
        self.meta = array("i")
        self.flop_index = array("q")
        self.flop_value = array("d")
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self.tracks: list[Track] = []
        self._track_ids: dict[tuple[bool, Any, Any], int] = {}
        self.colls: list[CollMeta] = []
        self.steps: list[StepRange] = []

    def intern(self, name: str) -> int:
        got = self._name_ids.get(name)
        if got is None:
            got = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return got

    def track_id(self, gpu: bool, pid: Any, tid: Any) -> int:
        key = (gpu, pid, tid)
        got = self._track_ids.get(key)
        if got is None:
            got = self._track_ids[key] = len(self.tracks)
            label = f"GPU {pid} stream {tid}" if gpu else f"pid {pid} thread {tid}"
            self.tracks.append(Track(gpu, pid, tid, label))
        return got

    def add(
        self,
        kind: int,
        name: str,
        start: int,
        end: int,
        track: int,
        corr: int = -1,
        ext: int = -1,
        meta: CollMeta | None = None,
        flops: float = 0.0,
    ) -> None:
        self.kind.append(kind)
        self.name.append(self.intern(name))
        self.start.append(start)
        self.end.append(end)
        self.track.append(track)
        self.corr.append(corr)
        self.ext.append(ext)
        if meta is None:
            self.meta.append(-1)
        else:
            self.meta.append(len(self.colls))
            self.colls.append(meta)
        if flops:
            self.flop_index.append(len(self.kind) - 1)
            self.flop_value.append(flops)

    def __len__(self) -> int:
        return len(self.kind)

    def build(self, shift_ns: int = 0, **info: Any) -> RankTrace:
        """The RankTrace, times shifted by shift_ns (a trace's time base), sorted by start."""
        start = np.frombuffer(self.start, dtype=np.int64) + shift_ns
        end = np.frombuffer(self.end, dtype=np.int64) + shift_ns
        order = np.argsort(start, kind="stable")
        flops = np.zeros(len(self.kind), dtype=np.float64)
        flops[np.frombuffer(self.flop_index, dtype=np.int64)] = np.frombuffer(
            self.flop_value, dtype=np.float64
        )
        steps = [
            StepRange(s.number, s.start + shift_ns, s.end + shift_ns, s.track, s.name)
            for s in sorted(self.steps, key=lambda s: (s.number, s.start))
        ]
        columns = {
            "kind": np.frombuffer(self.kind, dtype=np.int8)[order],
            "name": np.frombuffer(self.name, dtype=np.int32)[order],
            "start": start[order],
            "end": end[order],
            "track": np.frombuffer(self.track, dtype=np.int32)[order],
            "corr": np.frombuffer(self.corr, dtype=np.int64)[order],
            "ext": np.frombuffer(self.ext, dtype=np.int64)[order],
            "meta": np.frombuffer(self.meta, dtype=np.int32)[order],
            "flops": flops[order],
        }
        return RankTrace(
            names=self.names,
            tracks=self.tracks,
            colls=self.colls,
            steps=steps,
            **columns,
            **info,
        )


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Readers create millions of short-lived containers (decoded events, fetched rows)
    that reference counting frees; the cyclic collector would traverse them again and
    again for nothing (it halves JSON decoding speed). Readers build no cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
