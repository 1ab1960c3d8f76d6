"""Since when is a rank late? A single change point in its lag behind the median rank.

Used by the HTML report's summary until a straggler detector reports `since` in
its findings (the report prefers a finding's `since` when there is one).

Algorithm, over the rank's collectives in time order (lag = its enqueue or GPU
start minus the median rank's, whichever made it late more):
 1. clip the lags to their 1st..99th percentiles (one outlier cannot decide);
 2. for each split k, score = (mean after - mean before) * sqrt(k (n - k) / n),
    keeping at least 2% of the points on each side; take the best split;
 3. accept it when the mean lag after the split exceeds the mean before by more
    than 4 standard errors of that difference, the clock uncertainty and 1 us;
    otherwise, if the mean lag over everything exceeds 4 standard errors (and the
    same floors), the rank was late throughout; else it has no lasting lateness.
Means, not medians: a rank slow on the GPU is late at the first collective after
its compute and on time for the ones queued behind it, so most of its lags are
small and the median would miss it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.export.html_data import fetch
from rankwatch.model import Run

MIN_POINTS = 8
SIGMAS = 4.0  # standard errors a lasting change must exceed
MIN_LAG_NS = 1_000.0

ONSET_SQL = """
SELECT r.arrival_c - $t0 AS t, r.{column} AS lag, r.func, r.seq, m.comm_name
FROM collective_ranks r LEFT JOIN communicators m ON m.comm_key = r.comm_key
WHERE r.world_rank = $rank AND r.n_seen > 1 AND r.{column} IS NOT NULL
      AND r.arrival_c IS NOT NULL
ORDER BY t
"""


@dataclass(frozen=True)
class Onset:
    """When a rank's lateness began (time_s None: throughout) and how large it was."""

    measure: str  # gpu_start or arrival
    time_s: float | None
    func: str | None
    seq: int | None
    comm_name: str | None
    before_ns: float  # mean lag behind the median rank before the onset
    after_ns: float  # ... and from it on


def rank_onset(run: Run, rank: int, measure: str, t0: int, bound_ns: float) -> Onset | None:
    """The onset of `rank`'s lateness by `measure`; None when it has none that lasts."""
    column = "gpu_lag_ns" if measure == "gpu_start" else "arrival_lag_ns"
    data = fetch(run, ONSET_SQL.format(column=column), {"rank": rank, "t0": t0})
    if len(data["lag"]) < MIN_POINTS:
        return None
    lag = clipped(data["lag"])
    k = change_point(lag)
    before, after = float(lag[:k].mean()), float(lag[k:].mean())
    if after - before > _threshold(lag[:k], lag[k:], bound_ns) and after > 0:
        name = data["comm_name"][k]
        when = float(data["t"][k]) / 1e9
        comm = None if name is None else str(name)
        return Onset(measure, when, str(data["func"][k]), int(data["seq"][k]), comm, before, after)
    overall = float(lag.mean())
    if overall > _threshold(lag, None, bound_ns):
        return Onset(measure, None, None, None, None, overall, overall)
    return None


def clipped(lag: np.ndarray) -> np.ndarray:
    """The lags clipped to their 1st..99th percentiles, so one outlier cannot decide."""
    lo, hi = np.percentile(lag, [1, 99])
    return np.clip(lag, lo, hi)


def change_point(lag: np.ndarray) -> int:
    """Index of the best single split of `lag` into a lower and a higher mean."""
    n = len(lag)
    total = np.cumsum(lag)
    k = np.arange(1, n)
    before = total[:-1] / k
    after = (total[-1] - total[:-1]) / (n - k)
    score = (after - before) * np.sqrt(k * (n - k) / n)
    margin = max(1, n // 50)
    score[: margin - 1] = -np.inf
    score[len(score) - margin + 1 :] = -np.inf
    return int(k[int(np.argmax(score))])


def _threshold(a: np.ndarray, b: np.ndarray | None, bound_ns: float) -> float:
    """SIGMAS standard errors of mean(b) - mean(a) (of mean(a) alone when b is None),
    and never less than the clock uncertainty or 1 us."""
    var = a.var() / len(a) + (0.0 if b is None else b.var() / len(b))
    return max(SIGMAS * float(np.sqrt(var)), bound_ns, MIN_LAG_NS)
