"""Zeroed memory in transparent huge pages, for buffers that are kept.

Memory NumPy or malloc takes fresh costs a page fault per 4 KiB it fills; a
buffer of an anonymous private mapping with huge pages asked for (madvise
MADV_HUGEPAGE) costs one per 2 MiB. The native reader's held batches
(store.native) and the collective columns kept while parsing (store.captured)
are cut from here.
"""

from __future__ import annotations

import contextlib
import mmap

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
