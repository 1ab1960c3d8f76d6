"""glibc malloc settings for rankwatch's own analysis processes.

The detectors work on batches of 64k records: their NumPy temporaries are half a
megabyte to a few megabytes each, allocated and freed dozens of times per batch.
glibc serves such sizes from fresh mmap() pages until its adaptive threshold has
grown, and hands the top of the heap back to the kernel whenever it shrinks, so
each batch faults its working set in again: measured on 11.5 M records, 296,000
page faults and 1.3 s of system time (8 % of the run), against 54,000 and 0.3 s
with the settings below (bench/RESULTS.md section 5). A fixed mmap threshold of
32 MiB (glibc's largest) serves those temporaries from the heap, and a trim
threshold of 64 MiB keeps the freed memory for the next batch: at most that much
more resident memory.

mallopt() is per process: unlike MALLOC_* environment variables it does not reach
the training job that `rankwatch run` starts. Elsewhere than glibc nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20

_done = False


def _glibc(name: str, *argtypes: type) -> Callable[..., int] | None:
    """glibc's function `name` (returning int), or None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt, no malloc_trim)
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def keep_freed_memory() -> bool:
    """Apply the settings above (once); whether they took effect."""
    global _done
    if _done:
        return True
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is None:
        return False
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _done


def release_freed_memory() -> bool:
    """Hand back to the kernel what glibc keeps free in its arenas (malloc_trim);
    whether it could (glibc only).

    The trim threshold above applies to each arena, and every thread that allocates
    gets one: after align's kernels and their coordinating threads, at 3 M records,
    those kept about 230 MB free, which the HTML report (on the main thread's arena)
    then stacked its own memory on (peak RSS 1.09 GB, against 0.87 with this called
    first). It takes a few milliseconds."""
    trim = _glibc("malloc_trim", ctypes.c_size_t)
    if trim is None:
        return False
    trim(0)
    return True
