"""Memory for large buffers that does not fault in page by page.

Memory NumPy or malloc takes fresh costs a page fault per 4 KiB it fills. Two
ways around it: buffers that are kept come from an anonymous private mapping with
transparent huge pages asked for (madvise MADV_HUGEPAGE: one fault per 2 MiB),
cut from slabs (`Slabs`); buffers a thread fills again and again (a pass's or a
chunk's working arrays) are the thread's own, used again (`scratch`). The native
reader's held batches (store.native) and the collective columns kept while parsing
(store.captured) come from slabs; the align kernels' passes (align.kernels) and
rwp_capture's output (store.captured) use scratch.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from typing import Any

import numpy as np

SLAB_BYTES = 1 << 25  # kept buffers are cut from slabs this large (Slabs)


class Slabs:
    """Zeroed buffers cut from slabs of SLAB_BYTES (`anonymous`). An op reader's
    held batches (store.held) come from here: in separate NumPy arrays of a
    chunk's size each they cost, at 1 M op records, 53,000 more page faults and
    0.11 s more system time. A slab is unmapped once no buffer cut from it is
    referenced, so only buffers that are kept should come from slabs
    (Reader.holding). Not thread-safe: one per thread."""

    def __init__(self, slab_bytes: int = SLAB_BYTES) -> None:
        self.slab_bytes = slab_bytes
        self._slab: np.ndarray | None = None
        self._used = 0

    def take(self, nbytes: int) -> np.ndarray:
        """`nbytes` zeroed bytes, 64-byte aligned (Arrow's alignment)."""
        size = -(-max(nbytes, 1) // 64) * 64
        if size > self.slab_bytes // 4:  # a large one alone: no slab's tail wasted
            return anonymous(size)[:nbytes]
        if self._slab is None or self._used + size > len(self._slab):
            self._slab, self._used = anonymous(self.slab_bytes), 0
        out = self._slab[self._used : self._used + nbytes]
        self._used += size
        return out


def anonymous(nbytes: int) -> np.ndarray:
    """`nbytes` of fresh zeroed memory of a private mapping of its own, huge pages
    asked for (a shared one, mmap's default, is shared memory: no huge pages)."""
    if nbytes <= 0:
        return np.zeros(0, dtype=np.uint8)
    if not hasattr(mmap, "MAP_PRIVATE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        # cut at a 64-byte boundary, as a mapping's start is
        spare = np.zeros(nbytes + 64, dtype=np.uint8)
        start = -spare.ctypes.data % 64
        return spare[start : start + nbytes]
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without them: small pages
            region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, dtype=np.uint8)


_local = threading.local()


def scratch(name: str, size: int, dtype: Any) -> np.ndarray:
    """An uninitialised array of `size` elements from this thread's buffer `name`,
    which the thread's next call for `name` reuses: an align pass's rows and groups
    take tens of MB (at 1 M ops, rwa_prepare took 0.20 CPU s over fresh memory, 0.08
    over memory used before). Whatever outlives the next call is a copy, never one
    of these."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    have = buffers.get(name)
    if have is None or have.size < size or have.dtype != dtype:
        have = buffers[name] = np.empty(max(size, 1), dtype)
    return have[:size]


def release_scratch() -> None:
    """Drop this thread's buffers (a worker thread's go when it ends)."""
    _local.buffers = None
