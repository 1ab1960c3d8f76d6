"""Parse speed of two builds of the native reader, side by side in one process.

The development VM's two vCPUs differ in speed, and each changes with what its
sibling hyperthread runs: one file parses in 450 ns per record at one moment and
700 at the next. Runs in separate processes cannot tell a 5 % change from that.
Here both builds parse the same file in the same process, alternating, on the
core the process is pinned to (run it under `taskset -c 0`); the median of the
pairwise time ratios is the comparison, and the two builds' values must agree.

    gcc -O3 -shared -fPIC -fvisibility=hidden -D_GNU_SOURCE -o /tmp/old.so OLD/native/rwparse.c
    taskset -c 0 python bench/parse_ab.py RECORDS.log /tmp/old.so [NEW.so] [--reps 40]

NEW.so defaults to the installed build (rankwatch/_lib).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rankwatch import nativelib
from rankwatch.store import native


@dataclass
class Build:
    """One build's parser, bound to buffers for every line of the file."""

    name: str
    lib: ctypes.CDLL
    handle: ctypes.c_void_p
    chunk: native.Chunk
    bound: tuple

    @classmethod
    def load(cls, name: str, path: str, layout: native.Layout, rows: int) -> Build:
        lib = native._bind(ctypes.CDLL(path))
        err = ctypes.create_string_buffer(256)
        handle = ctypes.c_void_p(lib.rwp_new(layout.spec, err, len(err)))
        if not handle:
            raise SystemExit(f"{path}: {err.value.decode(errors='replace')}")
        chunk = native._new_chunk(layout, rows)
        return cls(name, lib, handle, chunk, chunk.pointers())

    def parse(self, text: np.ndarray, rows: int) -> float:
        """CPU seconds of this thread to parse the whole text once."""
        self.lib.rwp_reset(self.handle)
        if self.lib.rwp_bind(self.handle, rows, *self.bound) != 0:
            raise SystemExit(f"{self.name}: rwp_bind failed")
        start = time.thread_time()
        self.lib.rwp_parse(self.handle, text.ctypes.data, len(text), 1)
        return time.thread_time() - start


def _same_values(a: native.Chunk, b: native.Chunk, layout: native.Layout, rows: int) -> bool:
    """Whether both chunks hold the same rows: validity, and each value where valid
    (a null's slot holds whatever the buffer held)."""
    for slot in range(layout.slots):
        valid = native.unpack(a.valid[slot], rows)
        if not np.array_equal(valid, native.unpack(b.valid[slot], rows)):
            return False
        x, y = a.values[slot], b.values[slot]
        if x is None or y is None:
            continue
        if layout.slot_codes[slot] == "b":
            x, y = native.unpack(x, rows), native.unpack(y, rows)
        if not np.array_equal(x[:rows][valid], y[:rows][valid]):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", help="an op-record file (one rank's .log)")
    parser.add_argument("baseline", help="the baseline build of librankwatch-rwparse.so")
    parser.add_argument("build", nargs="?", help="the build compared (default: installed)")
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    installed = next((str(p) for p in nativelib.candidates(native.LIB_FILENAME) if p.is_file()),
                     None)  # fmt: skip
    if args.build is None and installed is None:
        raise SystemExit(f"no installed {native.LIB_FILENAME}: name the build to compare")
    data = Path(args.records).read_bytes()
    text = np.frombuffer(data, dtype=np.uint8)
    lines = native.count_newlines(text)
    layout = native.layout()
    paths = {"baseline": args.baseline, "build": args.build or installed}
    builds = [Build.load(name, path, layout, lines + 1) for name, path in paths.items()]
    times: list[list[float]] = [[], []]
    for _ in range(args.reps):
        for build, spent in zip(builds, times, strict=True):
            spent.append(build.parse(text, lines + 1))
    for build, spent in zip(builds, times, strict=True):
        spent_sorted = sorted(spent)
        per = [t / lines * 1e9 for t in (spent_sorted[0], spent_sorted[len(spent) // 2])]
        print(f"{build.name:8s} min {per[0]:6.1f}  median {per[1]:6.1f} ns/record")
    ratios = sorted(b / a for a, b in zip(*times, strict=True))
    same = _same_values(builds[0].chunk, builds[1].chunk, layout, lines)
    print(f"median pairwise ratio (build / baseline): {ratios[len(ratios) // 2]:.3f}; "
          f"same values: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
