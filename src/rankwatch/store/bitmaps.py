"""The validity bitmaps of the native reader's chunks (Apache Arrow's: LSB first)."""

from __future__ import annotations

import numpy as np


def bits_at(bitmap: np.ndarray, rows: np.ndarray | int) -> np.ndarray:
    """The bits of `rows` (an index array, or one row): 1 or 0, as uint8."""
    return (bitmap[rows >> 3] >> (rows & 7)) & 1
