"""A bag of equal-length numpy columns with attribute access (`recs.gap_g`),
which detectors may extend with columns of their own."""

from __future__ import annotations

import numpy as np


class Recs:
    __slots__ = ("_cols",)

    def __init__(self, cols: dict[str, np.ndarray] | None = None) -> None:
        object.__setattr__(self, "_cols", dict(cols or {}))

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self._cols[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: np.ndarray) -> None:
        self._cols[name] = value

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def __len__(self) -> int:
        return len(next(iter(self._cols.values()))) if self._cols else 0

    @property
    def names(self) -> list[str]:
        return list(self._cols)

    def take(self, index: np.ndarray) -> Recs:
        return Recs({k: v[index] for k, v in self._cols.items()})

    @staticmethod
    def concat(parts: list[Recs]) -> Recs:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Recs()
        if len(parts) == 1:
            return parts[0]
        names = parts[0].names
        return Recs({k: np.concatenate([p._cols[k] for p in parts]) for k in names})
