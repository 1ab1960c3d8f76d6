"""In-band clock alignment between hosts, from the collectives themselves.

Ranks on one host share its wall clock (the plugin converts GPU times to host
time per process, within `clock_error_ns`). Between hosts A and B, with
off_h = host h's clock minus reference time, every collective k both ran gives:

  causality   a rank cannot finish before the last rank started:
                off_A - off_B <= min_end_A(k) - max_start_B(k) + err_A + err_B   (upper)
                off_A - off_B >= max_start_A(k) - min_end_B(k) - err_A - err_B   (lower)
              (where a GPU start is unknown, e.g. flagged stale, the rank's arrival,
              which precedes it, gives the same bounds, only looser)
  end-synchrony  a collective ends on all ranks within microseconds:
                off_A - off_B ~= mean_end_A(k) - mean_end_B(k)                   (point)

Algorithm:
 1. per (collective, host): min end, max start, mean end, max clock_error (SQL);
 2. per host pair and collective: upper, lower, point (SQL self-join);
 3. drift: per pair a line through per-time-bucket medians of the point values;
    per-host drift by least squares over pairs (reference host fixed at 0);
 4. detrend; per pair U = min(upper), L = max(lower) (each widened by 3 sigma of
    the pair's slope times |t - t0|), P = median(point);
 5. offsets: weighted least squares over the pairs' P; the feasible interval of
    each host against the reference is the shortest-path solution of the
    difference constraints x_A - x_B <= U_AB, x_B - x_A <= -L_AB (Floyd-Warshall);
    the estimate is clipped into it and `bound_ns` = the farthest interval end:
    the true offset lies within +-bound_ns of the estimate as long as the plugin's
    GPU-to-host error bounds hold and drift is linear.

Times inside are nanoseconds relative to t0 (the middle of the observed span)
as DOUBLE, which keeps sub-nanosecond precision (absolute ns do not fit a double).

Steps 1 to 4 run as the SQL below, or, where the native reader kept the
collective columns (kernels.usable_kept), as compiled kernels over them
(kernels.clock_observations, kernels.ClockPairs): the same observations, pairs
and medians without materializing the pairs, at about half the time; the
estimates agree but for the order in which doubles are summed (tests compare).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rankwatch.align import groups
from rankwatch.model import Run
from rankwatch.store import background
from rankwatch.store.load import insert_tuples

MAX_ALL_PAIRS_HOSTS = 32  # above this, only ring + star pairs are used
BUCKETS = 32
SLOPE_SIGMAS = 3.0


@dataclass
class HostClock:
    host: str
    reference: bool
    offset_ns: float  # host clock minus reference clock at t0_ns
    drift_ppm: float  # and its rate of change
    bound_ns: float | None  # |true - estimated offset| <= bound_ns; None: unknown
    lo_ns: float | None = None  # feasible interval of the offset at t0_ns
    hi_ns: float | None = None
    pairs: int = 0  # host pairs with shared collectives
    constraints: int = 0  # (collective, pair) observations
    method: str = "in_band"  # in_band, reference, single_host, unaligned


@dataclass
class ClockEstimate:
    reference: str | None
    t0_ns: int
    hosts: list[HostClock] = field(default_factory=list)
    consistent: bool = True
    notes: list[str] = field(default_factory=list)

    def host(self, name: str) -> HostClock | None:
        return next((h for h in self.hosts if h.host == name), None)

    @property
    def max_bound_ns(self) -> float | None:
        """The largest bound over aligned hosts (None if any host is unaligned)."""
        bounds = [h.bound_ns for h in self.hosts]
        return None if any(b is None for b in bounds) else max(bounds, default=0.0)

    def to_dict(self) -> dict:
        return asdict(self)


# multi: communicators on more than one host (min < max: no distinct count, which
# would materialize its input).
OBS_SQL = """
CREATE OR REPLACE TEMP TABLE clock_obs AS
WITH multi AS (
    SELECT comm_key FROM ops WHERE kind = 'coll' GROUP BY comm_key HAVING min(host) < max(host)
)
SELECT o.comm_key, o.func, o.seq, o.host,
       CAST(min(o.gpu_end_ns) - ? AS DOUBLE) AS min_end,
       CAST(max(coalesce(o.gpu_start_ns, o.arrival_ns)) - ? AS DOUBLE) AS max_start,
       avg(CAST(o.gpu_end_ns - ? AS DOUBLE)) AS mean_end,
       CAST(max(coalesce(o.clock_error_ns, 0)) AS DOUBLE) AS err
FROM ops o JOIN multi m ON o.comm_key = m.comm_key
WHERE o.kind = 'coll' AND o.gpu_end_ns IS NOT NULL AND coalesce(o.complete, true)
GROUP BY o.comm_key, o.func, o.seq, o.host
"""

PAIRS_SQL = """
CREATE OR REPLACE TEMP TABLE clock_pairs AS
SELECT a.host AS ha, b.host AS hb, (a.mean_end + b.mean_end) / 2 AS t,
       a.mean_end - b.mean_end AS d,
       a.min_end - b.max_start + a.err + b.err AS up,
       a.max_start - b.min_end - a.err - b.err AS lo
FROM clock_obs a
JOIN clock_obs b ON a.comm_key = b.comm_key AND a.func = b.func AND a.seq = b.seq
    AND a.host < b.host
{pair_filter}
"""

BUCKET_SQL = """
SELECT ha, hb, bucket, avg(t) AS t, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY d) AS d,
       count(*) AS n
FROM (SELECT ha, hb, t, d, floor(t / ?) AS bucket FROM clock_pairs) AS b
GROUP BY ha, hb, bucket
"""

DETRENDED_SQL = """
SELECT p.ha, p.hb, count(*) AS n,
       min(p.up - (da.slope - db.slope) * p.t + e.slope_err * abs(p.t)) AS upper_bound,
       max(p.lo - (da.slope - db.slope) * p.t - e.slope_err * abs(p.t)) AS lower_bound,
       PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY p.d - (da.slope - db.slope) * p.t) AS point
FROM clock_pairs p
JOIN clock_host_drift da ON da.host = p.ha
JOIN clock_host_drift db ON db.host = p.hb
JOIN clock_pair_err e ON e.ha = p.ha AND e.hb = p.hb
GROUP BY p.ha, p.hb
"""

Pair = tuple[str, str]


def _hosts(run: Run) -> list[str]:
    # op_groups where map_ranks made it; a run of trace rows has only a lean ops
    source = groups.TABLE if groups.TABLE in run.tables else "ops"
    sql = f"SELECT DISTINCT host FROM {source} ORDER BY host"
    return [h for (h,) in run.con.execute(sql).fetchall()]


def _reference(run: Run, hosts: list[str]) -> str:
    """The host of world rank 0 when known, else the first host by name."""
    if "processes" in run.tables:
        rows = run.con.execute("SELECT host FROM processes ORDER BY world_rank LIMIT 1").fetchall()
        if rows and rows[0][0] in hosts:
            return rows[0][0]
    return hosts[0]


def _span(run: Run) -> tuple[int, int] | None:
    if groups.TABLE in run.tables:
        sql = (
            "SELECT min(first_timed_start_ns), max(last_timed_end_ns) "
            f"FROM {groups.TABLE} WHERE kind = 'coll'"
        )
    else:
        sql = (
            "SELECT min(gpu_start_ns), max(gpu_end_ns) FROM ops "
            "WHERE kind = 'coll' AND gpu_start_ns IS NOT NULL AND gpu_end_ns IS NOT NULL"
        )
    rows = run.con.execute(sql).fetchall()
    return None if not rows or rows[0][0] is None else (int(rows[0][0]), int(rows[0][1]))


def _allowed_pairs(hosts: list[str], ref: str) -> list[Pair]:
    """All host pairs for small jobs; a ring plus a star around the reference above
    (each pair as (smaller, larger) name)."""
    if len(hosts) <= MAX_ALL_PAIRS_HOSTS:
        ordered = sorted(hosts)
        return [(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :]]
    pairs = {tuple(sorted((a, b))) for a, b in zip(hosts, hosts[1:] + hosts[:1], strict=True)}
    pairs |= {tuple(sorted((ref, h))) for h in hosts if h != ref}
    return sorted(pairs)  # type: ignore[arg-type]


def _pair_filter(run: Run, hosts: list[str], ref: str) -> str:
    """PAIRS_SQL's join with the allowed pairs (none: all pairs, for small jobs)."""
    if len(hosts) <= MAX_ALL_PAIRS_HOSTS:
        return ""
    pairs = _allowed_pairs(hosts, ref)
    _temp_table(run, "clock_allowed_pairs", ["ha VARCHAR", "hb VARCHAR"], pairs)
    return "JOIN clock_allowed_pairs ap ON ap.ha = a.host AND ap.hb = b.host"


def _temp_table(run: Run, name: str, columns: list[str], rows: list[tuple]) -> None:
    run.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({', '.join(columns)})")
    insert_tuples(run.con, name, columns, rows)


def _fit_lines(rows: list[tuple]) -> dict[Pair, tuple[float, float, float, int]]:
    """Per pair: (slope, intercept, slope standard error, observations) of the point
    values against time, fitted through per-bucket medians (BUCKET_SQL's rows)."""
    by_pair: dict[Pair, list[tuple[float, float, int]]] = {}
    for ha, hb, _, t, d, n in rows:
        by_pair.setdefault((ha, hb), []).append((float(t), float(d), int(n)))
    fits = {}
    for pair, pts in by_pair.items():
        t, d, n = (np.array(x) for x in zip(*pts, strict=True))
        if len(t) < 3 or np.ptp(t) <= 0:
            fits[pair] = (0.0, float(np.median(d)), 0.0, int(n.sum()))
            continue
        slope, intercept = np.polyfit(t, d, 1)
        resid = d - (slope * t + intercept)
        spread = np.sqrt(np.sum((t - t.mean()) ** 2))
        stderr = float(np.sqrt(np.sum(resid**2) / (len(t) - 2)) / spread)
        fits[pair] = (float(slope), float(intercept), stderr, int(n.sum()))
    return fits


def _connected(pairs: list[Pair], ref: str) -> set[str]:
    """The hosts linked to ref through the pairs (one pass over them: at 512 hosts a
    scan of every pair per host took 0.26 s)."""
    links: dict[str, list[str]] = {}
    for a, b in pairs:
        links.setdefault(a, []).append(b)
        links.setdefault(b, []).append(a)
    seen, todo = {ref}, [ref]
    while todo:
        for y in links.get(todo.pop(), ()):
            if y not in seen:
                seen.add(y)
                todo.append(y)
    return seen


def _least_squares(
    values: dict[Pair, float], weights: dict[Pair, float], ref: str
) -> dict[str, float]:
    """x with x_ref = 0 minimising sum w (x_a - x_b - v_ab)^2, for hosts linked to ref."""
    hosts = sorted(_connected(list(values), ref) - {ref})
    if not hosts:
        return {ref: 0.0}
    col = {h: i for i, h in enumerate(hosts)}
    usable = [p for p in values if p[0] in col or p[1] in col]
    if len(hosts) > MAX_ALL_PAIRS_HOSTS:
        x = _weighted_laplacian_solve(usable, values, weights, col)
        return {ref: 0.0, **{h: float(x[col[h]]) for h in hosts}}
    a = np.zeros((len(usable), len(hosts)))
    b = np.zeros(len(usable))
    for i, (ha, hb) in enumerate(usable):
        w = np.sqrt(weights[(ha, hb)])
        if ha in col:
            a[i, col[ha]] = w
        if hb in col:
            a[i, col[hb]] = -w
        b[i] = w * values[(ha, hb)]
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    return {ref: 0.0, **{h: float(x[col[h]]) for h in hosts}}


def _weighted_laplacian_solve(
    usable: list[Pair], values: dict[Pair, float], weights: dict[Pair, float],
    col: dict[str, int],
) -> np.ndarray:  # fmt: skip
    """_least_squares' x through its normal equations: the pairs' weighted Laplacian
    (the reference's row and column dropped) is positive definite on hosts linked to
    it, n x n for n hosts where lstsq's SVD works on pairs x n (at 512 hosts 0.14 s
    a solve, growing with the cube: minutes at 2,048)."""
    n = len(col)
    lap, rhs = np.zeros((n, n)), np.zeros(n)
    for ha, hb in usable:
        w, v = weights[(ha, hb)], values[(ha, hb)]
        i, j = col.get(ha), col.get(hb)
        if i is not None:
            lap[i, i] += w
            rhs[i] += w * v
        if j is not None:
            lap[j, j] += w
            rhs[j] -= w * v
        if i is not None and j is not None:
            lap[i, j] -= w
            lap[j, i] -= w
    return np.linalg.solve(lap, rhs)


def _intervals(
    bounds: dict[Pair, tuple[float, float]], hosts: list[str], ref: str
) -> tuple[dict[str, tuple[float, float]], bool]:
    """Feasible [lo, hi] of x_h - x_ref under L_ab <= x_a - x_b <= U_ab (shortest paths).

    Returns the intervals of hosts linked to ref, and False if the constraints
    contradict each other (a negative cycle: an error bound did not hold). All pairs
    by Floyd-Warshall for the few hosts whose every pair is used, from and to ref
    by Bellman-Ford on the ring and star of more (_intervals_sparse)."""
    if len(hosts) > MAX_ALL_PAIRS_HOSTS:
        return _intervals_sparse(bounds, hosts, ref)
    idx = {h: i for i, h in enumerate(hosts)}
    dist = np.full((len(hosts), len(hosts)), np.inf)
    np.fill_diagonal(dist, 0.0)
    for (ha, hb), (lower, upper) in bounds.items():
        a, b = idx[ha], idx[hb]
        dist[b, a] = min(dist[b, a], upper)  # x_a - x_b <= upper
        dist[a, b] = min(dist[a, b], -lower)  # x_b - x_a <= -lower
    for k in range(len(hosts)):
        dist = np.minimum(dist, dist[:, k, None] + dist[None, k, :])
    consistent = bool(np.all(np.diag(dist) >= -1e-6))
    r = idx[ref]
    out = {
        h: (-float(dist[i, r]), float(dist[r, i]))
        for h, i in idx.items()
        if np.isfinite(dist[r, i]) and np.isfinite(dist[i, r])
    }
    return out, consistent


def _relaxed(dist: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> bool:
    """One Bellman-Ford round over the edges src -> dst of weight w, in place;
    whether any distance fell (by more than the 1e-6 Floyd-Warshall's check allows
    a cycle, so that rounding alone does not go on forever)."""
    best = dist.copy()
    np.minimum.at(best, dst, dist[src] + w)
    fell = bool(np.any(best < dist - 1e-6))
    dist[:] = best
    return fell


def _intervals_sparse(
    bounds: dict[Pair, tuple[float, float]], hosts: list[str], ref: str
) -> tuple[dict[str, tuple[float, float]], bool]:
    """_intervals over a few edges per host: shortest paths from ref and to it (from
    ref over the reversed edges), and a negative cycle anywhere found from a source
    linked to every host; each in at most as many rounds as there are hosts, the
    edges' count each (Floyd-Warshall's hosts cubed: 0.45 s at 512 hosts)."""
    idx = {h: i for i, h in enumerate(hosts)}
    n = len(hosts)
    src, dst, w = [], [], []
    for (ha, hb), (lower, upper) in bounds.items():
        a, b = idx[ha], idx[hb]
        src += [b, a]
        dst += [a, b]
        w += [upper, -lower]  # x_a - x_b <= upper, x_b - x_a <= -lower
    edges = (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(w))
    anywhere, consistent = np.zeros(n), False
    for _ in range(n + 1):  # still falling after n rounds: a negative cycle
        if not _relaxed(anywhere, *edges):
            consistent = True
            break
    r = idx[ref]
    reach = []
    for forward in (True, False):
        dist = np.full(n, np.inf)
        dist[r] = 0.0
        one_way = edges if forward else (edges[1], edges[0], edges[2])
        for _ in range(n):
            if not _relaxed(dist, *one_way):
                break
        reach.append(dist)
    from_ref, to_ref = reach
    out = {
        h: (-float(to_ref[i]), float(from_ref[i]))
        for h, i in idx.items()
        if np.isfinite(from_ref[i]) and np.isfinite(to_ref[i])
    }
    return out, consistent


def _drifts(hosts: list[str], ref: str, bucket_rows: list[tuple]) -> tuple[dict, dict]:
    """Per-host drift (ns per ns) and per-pair slope uncertainty."""
    fits = _fit_lines(bucket_rows)
    slopes = _least_squares(
        {p: f[0] for p, f in fits.items()}, {p: float(f[3]) for p, f in fits.items()}, ref
    )
    drift = {h: slopes.get(h, 0.0) for h in hosts}
    slope_err = {p: SLOPE_SIGMAS * f[2] for p, f in fits.items()}
    return drift, slope_err


def _detrended_sql(run: Run, drift: dict, slope_err: dict) -> list[tuple]:
    """DETRENDED_SQL's rows, drift and slope errors registered for it."""
    _temp_table(run, "clock_host_drift", ["host VARCHAR", "slope DOUBLE"], list(drift.items()))
    _temp_table(
        run,
        "clock_pair_err",
        ["ha VARCHAR", "hb VARCHAR", "slope_err DOUBLE"],
        [(a, b, e) for (a, b), e in slope_err.items()],
    )
    return run.con.execute(DETRENDED_SQL).fetchall()


@dataclass
class Observing:
    """What estimate_clocks reads of op_groups (the hosts, the span of GPU-timed
    collectives), and the compiled kernels' observations (step 1) computing on
    threads of their own meanwhile: `observations()` waits for them (None: no
    usable kept columns, or a kernel declined; the SQL form runs then). align()
    starts them before it maps ranks, whose SQL runs on one core: at 1 M ops
    map_ranks' 50 to 75 ms ran inside the observations' 135 to 145 ms."""

    hosts: list[str]
    span: tuple[int, int] | None
    observations: Callable[[], Any] = lambda: None

    @property
    def t0_ns(self) -> int:
        """The middle of the span (0 without one)."""
        return (self.span[0] + self.span[1]) // 2 if self.span else 0


def observe(run: Run) -> Observing:
    """Read the hosts and span (op_groups made) and start the compiled observations
    where they apply (nothing to align on one host or without a span)."""
    from rankwatch.align import kernels

    obs = Observing(_hosts(run), _span(run))
    kept = kernels.usable_kept(run)
    if len(obs.hosts) <= 1 or obs.span is None or kept is None:
        return obs
    # raw host times (clocks=False), and no world ranks: an observation has none
    job = kernels.job_tables(run.con, kept, clocks=False, ranks=False)
    t0, passes = obs.t0_ns, kernels.passes(kept.rows)

    def compute() -> Any:
        try:
            return kernels.clock_observations(kept, job, t0, passes)
        except kernels.Declined:
            return None

    obs.observations = background.start(compute)
    return obs


def _native_pairs(observing: Observing, ref: str, width: float) -> Any:
    """kernels.ClockPairs from the compiled observations, or None (none, or a kernel
    declined): the SQL form runs instead."""
    from rankwatch.align import kernels

    obs = observing.observations()
    if obs is None:
        return None
    try:
        return kernels.ClockPairs(obs, _allowed_pairs(observing.hosts, ref), width)
    except kernels.Declined:
        return None


def _pair_rows(run: Run, observing: Observing, ref: str, width: float):
    """BUCKET_SQL's rows, and a function giving DETRENDED_SQL's from drift and slope
    errors: from the compiled kernels where they apply, else from SQL."""
    native = _native_pairs(observing, ref, width)
    if native is not None:
        return native.bucket_rows(), native.detrended_rows
    t0 = observing.t0_ns
    run.con.execute(OBS_SQL, [t0, t0, t0])
    run.con.execute(PAIRS_SQL.format(pair_filter=_pair_filter(run, observing.hosts, ref)))
    rows = run.con.execute(BUCKET_SQL, [width]).fetchall()
    return rows, lambda drift, slope_err: _detrended_sql(run, drift, slope_err)


def _offsets(rows: list[tuple], hosts: list[str], ref: str):
    """Detrended pair bounds -> (estimates, feasible intervals, consistent)."""
    bounds = {(a, b): (float(lo), float(up)) for a, b, _, up, lo, _ in rows}
    points = {(a, b): float(p) for a, b, _, _, _, p in rows}
    weights = {(a, b): 1.0 / max(up - lo, 1.0) ** 2 for (a, b), (lo, up) in bounds.items()}
    estimate = _least_squares(points, weights, ref)
    intervals, consistent = _intervals(bounds, hosts, ref)
    return estimate, intervals, consistent


def _host_rows(hosts, ref, drift, estimate, intervals, consistent, rows) -> list[HostClock]:
    pairs: dict[str, int] = {}
    constraints: dict[str, int] = {}
    for a, b, n, *_ in rows:
        for h in (a, b):
            pairs[h] = pairs.get(h, 0) + 1
            constraints[h] = constraints.get(h, 0) + int(n)
    out = []
    for h in hosts:
        if h == ref:
            out.append(
                HostClock(
                    h,
                    True,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    pairs.get(h, 0),
                    constraints.get(h, 0),
                    "reference",
                )
            )
            continue
        if h not in estimate:
            out.append(HostClock(h, False, 0.0, 0.0, None, method="unaligned"))
            continue
        lo, hi = intervals.get(h, (None, None))
        x = estimate[h] if lo is None else min(max(estimate[h], lo), hi)
        bound = None if lo is None or not consistent else max(x - lo, hi - x)
        out.append(
            HostClock(
                h, False, x, drift[h] * 1e6, bound, lo, hi, pairs.get(h, 0), constraints.get(h, 0)
            )
        )
    return out


HOST_CLOCK_COLUMNS = (
    "host VARCHAR, reference BOOLEAN, offset_ns DOUBLE, drift_ppm DOUBLE, t0_ns BIGINT, "
    "bound_ns DOUBLE, lo_ns DOUBLE, hi_ns DOUBLE, pairs BIGINT, constraints BIGINT, method VARCHAR"
)


def _save(run: Run, est: ClockEstimate) -> None:
    run.con.execute(f"CREATE OR REPLACE TABLE host_clock ({HOST_CLOCK_COLUMNS})")
    rows = [
        (
            h.host,
            h.reference,
            h.offset_ns,
            h.drift_ppm,
            est.t0_ns,
            h.bound_ns,
            h.lo_ns,
            h.hi_ns,
            h.pairs,
            h.constraints,
            h.method,
        )
        for h in est.hosts
    ]
    insert_tuples(run.con, "host_clock", HOST_CLOCK_COLUMNS.split(", "), rows)
    run.tables["host_clock"] = "host_clock"
    run.meta["clock"] = est


def _drop_temps(run: Run) -> None:
    for name in (
        "clock_obs",
        "clock_pairs",
        "clock_host_drift",
        "clock_pair_err",
        "clock_allowed_pairs",
    ):
        run.con.execute(f"DROP TABLE IF EXISTS {name}")


def _trivial(run: Run, observing: Observing) -> ClockEstimate:
    """One host (nothing to align) or no GPU-timed collectives (nothing to align with)."""
    hosts, t0 = observing.hosts, observing.t0_ns
    if len(hosts) <= 1:
        return ClockEstimate(
            hosts[0] if hosts else None,
            t0,
            [HostClock(h, True, 0.0, 0.0, 0.0, 0.0, 0.0, method="single_host") for h in hosts],
        )
    ref = _reference(run, hosts)
    rows = [
        HostClock(
            h,
            h == ref,
            0.0,
            0.0,
            0.0 if h == ref else None,
            method="reference" if h == ref else "unaligned",
        )
        for h in hosts
    ]
    return ClockEstimate(
        ref,
        t0,
        rows,
        notes=["no GPU-timed collectives span several hosts: host clocks cannot be aligned"],
    )


def estimate_clocks(run: Run, observing: Observing | None = None) -> ClockEstimate:
    """Estimate every host's clock offset and drift against a reference host (see module
    doc), store them in table host_clock, and return them. observing: observe(run)'s,
    started earlier (default: now)."""
    observing = observing or observe(run)
    hosts, span = observing.hosts, observing.span
    if len(hosts) <= 1 or span is None:
        est = _trivial(run, observing)
        _save(run, est)
        return est
    ref = _reference(run, hosts)
    t0 = observing.t0_ns
    width = max((span[1] - span[0]) / BUCKETS, 2e8)
    bucket_rows, detrended = _pair_rows(run, observing, ref, width)
    drift, slope_err = _drifts(hosts, ref, bucket_rows)
    rows = detrended(drift, slope_err)
    estimate, intervals, consistent = _offsets(rows, hosts, ref)
    est = ClockEstimate(
        ref, t0, _host_rows(hosts, ref, drift, estimate, intervals, consistent, rows), consistent
    )
    if not consistent:
        est.notes.append(
            "clock constraints contradict each other: some GPU-to-host error "
            "bound did not hold; offsets are least-squares estimates without bounds"
        )
    unaligned = [h.host for h in est.hosts if h.method == "unaligned"]
    if unaligned:
        est.notes.append(
            f"{len(unaligned)} host(s) share no GPU-timed collective with the "
            f"reference host: {', '.join(unaligned[:5])}"
        )
    _drop_temps(run)
    _save(run, est)
    return est


def correction_sql(column: str, alias: str = "c") -> str:
    """SQL for `column` (host clock, ns) mapped to the reference clock via host_clock."""
    shift = (
        f"CAST(round({alias}.offset_ns + {alias}.drift_ppm * 1e-6 * "
        f"CAST({column} - {alias}.t0_ns AS DOUBLE)) AS BIGINT)"
    )
    return f"({column} - {shift})"
