"""Per (process, slot) state arrays that grow when new slots appear."""

from __future__ import annotations

import numpy as np


class Grid:
    """Named 2-D (or 3-D) arrays indexed [proc, slot(, k)], all with the same slot count."""

    def __init__(self, n_procs: int, specs: dict[str, tuple[object, float, int]]) -> None:
        # specs: name -> (dtype, fill value, depth (0: 2-D))
        self.n_procs = n_procs
        self.specs = specs
        self.width = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.ensure(1, n_procs)

    def ensure(self, width: int, rows: int | None = None) -> None:
        rows = self.n_procs if rows is None else rows
        if width <= self.width and rows <= self.n_procs:
            return
        new_w = self.width if width <= self.width else max(width, 2 * self.width, 8)
        new_r = self.n_procs if rows <= self.n_procs else max(rows, 2 * self.n_procs)
        for name, (dtype, fill, depth) in self.specs.items():
            shape = (new_r, new_w) if depth == 0 else (new_r, new_w, depth)
            a = np.full(shape, fill, dtype=dtype)
            if name in self.arrays:
                a[: self.n_procs, : self.width] = self.arrays[name]
            self.arrays[name] = a
        self.width, self.n_procs = new_w, new_r

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]
