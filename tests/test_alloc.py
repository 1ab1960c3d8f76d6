"""rankwatch.alloc: the analysis processes keep freed memory for the next batch."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHURN = """
import resource, sys
import numpy as np
if sys.argv[1] == "tuned":
    from rankwatch.alloc import keep_freed_memory
    assert keep_freed_memory()
a = np.ones(1 << 17)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(400):  # what a batch does: temporaries of a few MB, made and freed
    b = a * 2.0
    c = b + a
    del b, c
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_temporaries_reuse_memory_instead_of_faulting_it_in_again() -> None:
    default, tuned = _faults("default"), _faults("tuned")
    # 1 MiB temporaries: with glibc's defaults each is a fresh mmap (256 faults);
    # kept, they fault in once
    assert tuned * 20 < default, (tuned, default)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_a_job_started_from_a_tuned_process_keeps_glibc_defaults() -> None:
    """`rankwatch run` starts the training job: the settings must not reach it."""
    parent = (
        "import subprocess, sys\n"
        "from rankwatch.alloc import keep_freed_memory\n"
        "assert keep_freed_memory()\n"
        "out = subprocess.run([sys.executable, '-c', sys.argv[1], 'default'],\n"
        "                     capture_output=True, text=True, check=True).stdout\n"
        "print(out)\n"
    )
    done = subprocess.run([sys.executable, "-c", parent, CHURN], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    child = int(done.stdout)
    assert child > 20 * _faults("tuned"), child


ARENA = """
import threading
import numpy as np
from rankwatch.alloc import keep_freed_memory, release_freed_memory
assert keep_freed_memory()

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) // 1024

def churn():  # a thread's arena: 2 MB blocks, most freed, a last one kept at its top
    blocks = [np.ones(1 << 18) for _ in range(60)]
    global kept
    kept = blocks[-1]
    del blocks

thread = threading.Thread(target=churn)
thread.start()
thread.join()
held = rss_mb()
assert release_freed_memory()
print(held, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_memory_freed_in_another_threads_arena_goes_back_to_the_kernel() -> None:
    done = subprocess.run([sys.executable, "-c", ARENA], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    held, after = (int(x) for x in done.stdout.split())
    # about 118 MB freed below the kept block stay resident in the thread's arena
    # (under the trim threshold) until release_freed_memory hands them back
    assert held - after > 80, (held, after)
