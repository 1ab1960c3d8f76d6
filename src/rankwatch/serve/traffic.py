"""Collective traffic per operation and size class: counts, payload and bus bytes,
and a duration histogram, accumulated from each batch of op records.

Bus bandwidth is not kept as a gauge: `bus_bytes / duration` over any window is
the duration-weighted mean of the records' own busbw (nccl-tests factors), so
Prometheus computes it with rate() and the page over its recent ticks.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

# Duration histogram bucket bounds: 2^k microseconds, 1 us ... 2^26 us (about 67 s).
DURATION_BUCKETS_S: tuple[float, ...] = tuple(2.0**k * 1e-6 for k in range(27))
_KIB = 1024
# Size classes: powers of 4 from 1 KiB to 4 GiB (index 0 is below 1 KiB).
SIZE_LOG4_MIN, SIZE_LOG4_MAX = 5, 16
RECENT_S = 30.0

TRAFFIC_SQL = f"""
SELECT func AS op,
       CAST(least(greatest(floor(log2(greatest(coalesce(msg_bytes, 0), 1)) / 2),
                           {SIZE_LOG4_MIN - 1}), {SIZE_LOG4_MAX}) AS INTEGER) AS size_log4,
       CAST(least(greatest(ceil(log2(greatest(exec_time_ns, 1) / 1000.0)), 0), 27) AS INTEGER)
           AS bucket,
       count(*) AS n, sum(exec_time_ns) AS dur_ns, sum(coalesce(msg_bytes, 0)) AS payload,
       sum(coalesce(busbw_gbs * exec_time_ns, 0)) AS bus_bytes
FROM {{table}}
WHERE kind IN ('coll', 'p2p') AND coalesce(complete, true) AND exec_time_ns IS NOT NULL
      AND func IS NOT NULL
GROUP BY ALL
"""


def size_class(log4: int) -> str:
    """The label of a power-of-4 size class, e.g. '1MiB-4MiB'."""
    if log4 < SIZE_LOG4_MIN:
        return "0-1KiB"
    if log4 >= SIZE_LOG4_MAX:
        return "4GiB+"
    return f"{_bytes(4**log4)}-{_bytes(4 ** (log4 + 1))}"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < _KIB:
            return f"{n}{unit}"
        n //= _KIB
    return f"{n}TiB"


@dataclass
class Series:
    """One (op, size class): cumulative counts and the duration histogram."""

    count: int = 0
    duration_s: float = 0.0
    payload_bytes: float = 0.0
    bus_bytes: float = 0.0
    buckets: np.ndarray = field(default_factory=lambda: np.zeros(28, dtype=np.int64))


class Traffic:
    """Cumulative traffic per (op, size class), and a recent window for the page."""

    def __init__(self, recent_s: float = RECENT_S) -> None:
        self.series: dict[tuple[str, str], Series] = {}
        self.recent: deque[tuple[float, dict[tuple[str, str], tuple[float, float, int]]]] = deque()
        self.recent_s = recent_s

    def add(self, con, table: str = "ops", wall: float | None = None) -> None:  # noqa: ANN001
        """Fold the op records of `table` (a DuckDB table or view) in."""
        rows = con.execute(TRAFFIC_SQL.format(table=table)).fetchall()
        tick: dict[tuple[str, str], tuple[float, float, int]] = {}
        for op, log4, bucket, n, dur_ns, payload, bus in rows:
            key = (op, size_class(int(log4)))
            s = self.series.setdefault(key, Series())
            s.count += int(n)
            s.duration_s += float(dur_ns) / 1e9
            s.payload_bytes += float(payload)
            s.bus_bytes += float(bus)
            s.buckets[int(bucket)] += int(n)
            b, d, c = tick.get(key, (0.0, 0.0, 0))
            tick[key] = (b + float(bus), d + float(dur_ns) / 1e9, c + int(n))
        now = time.time() if wall is None else wall
        if tick:
            self.recent.append((now, tick))
        while self.recent and self.recent[0][0] < now - self.recent_s:
            self.recent.popleft()

    def recent_bandwidth(self) -> list[dict]:
        """Per (op, size class): bus bandwidth (GB/s) and count over the recent window."""
        sums: dict[tuple[str, str], list[float]] = {}
        for _, tick in self.recent:
            for key, (bus, dur, n) in tick.items():
                acc = sums.setdefault(key, [0.0, 0.0, 0])
                acc[0] += bus
                acc[1] += dur
                acc[2] += n
        out = []
        for (op, size), (bus, dur, n) in sorted(sums.items(), key=_order):
            gbs = bus / dur / 1e9 if dur > 0 else None
            out.append({"op": op, "size_class": size, "busbw_gbs": gbs, "count": int(n)})
        return out


def _order(item) -> tuple:  # noqa: ANN001
    (op, size), _ = item
    return (op, _size_rank(size))


def _size_rank(label: str) -> int:
    for log4 in range(SIZE_LOG4_MIN - 1, SIZE_LOG4_MAX + 1):
        if size_class(log4) == label:
            return log4
    return 99
