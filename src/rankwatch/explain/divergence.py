"""First unexplained divergence: for each slow step (and for the steady state), the
rank whose late arrival determined the step, and the first op on that rank that
departs from its peers and from its own history.

1. Step time = median over ranks of the step's wall time. A step is slow when it
   exceeds the median step by SLOW_SIGMAS robust sigmas, SLOW_REL and MIN_SLOW_NS.
2. In a slow step, the determining collective is the one with the most total
   waiting (sum over ranks of wait, collectives._split); its last rank to arrive is
   the culprit candidate. Without significant waiting, the step is slow on every
   rank alike and the search runs against history only, on every rank.
3. Walk the culprit's ops of that step (GPU ops and data-loading ranges; not the
   communication, whose length is waiting) in time order up to its arrival at the
   collective. An op departs when its duration, or the device idle gap before it,
   exceeds both the same op on the other ranks in that step (peers) and the same
   op on this rank in healthy steps (history) by more than every threshold:
   NOISE_SIGMAS robust sigmas of either, REL_EXTRA of the reference, MIN_EXTRA_NS,
   and WAIT_SHARE of the wait being explained. The first such op is the root.
   A gap that coincides with this rank waiting in a collective is explained by that
   wait, not a root.
4. No op departs on the culprit but it waited earlier in the step: the lateness came
   from further back; hop to that collective's last rank (up to MAX_HOPS).
5. Steady state: over the non-slow steps, a rank that is the determining last
   arriver in at least STEADY_SHARE of them with significant waits is a persistent
   straggler; its root is the first op whose median excess over peers passes the
   same thresholds. Healthy jobs (the last arriver rotates, waits are noise) get
   no finding.
6. Inserted work (inserted.py): ops a rank runs in a step that neither its peers'
   same step nor its own healthy steps contain have nothing to be compared with,
   so steps 3 and 5 cannot see them. Runs of such ops whose GPU time passes
   MIN_EXTRA_NS, INSERT_REL of the median step and WAIT_SHARE of the wait are
   roots too: in a slow step when they come before the first departing op, in the
   steady state when they explain more than the op found there, and on their own
   (the first step each rank shows them) when no other finding names them.

Fewer than MIN_STEPS_FOR_SLOW steps give no slow steps: two step times cannot tell
a slow step from a fast one.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rankwatch.explain.collectives import Collective, CollectiveTable
from rankwatch.explain.inserted import Run, Structure, describe
from rankwatch.explain.ledger import Ledger
from rankwatch.explain.links import Links
from rankwatch.explain.optable import OpTable
from rankwatch.explain.steps import StepTable

SLOW_SIGMAS = 4.0
SLOW_REL = 0.03
MIN_SLOW_NS = 200_000
MIN_WAIT_REL = 0.02  # a wait matters when it is 2% of the median step ...
MIN_WAIT_NS = 200_000  # ... and at least 0.2 ms
NOISE_SIGMAS = 5.0
REL_EXTRA = 0.10
MIN_EXTRA_NS = 50_000
WAIT_SHARE = 0.05
MAX_HOPS = 4
STEADY_SHARE = 0.6
MIN_STEADY_STEPS = 3
MAD_SIGMA = 1.4826
INSERT_REL = 0.01  # inserted work matters from 1% of the median step
MIN_STEPS_FOR_SLOW = 3


@dataclass
class Finding:
    kind: str  # slow_step | steady_state
    step: int | None
    step_time_ns: int
    baseline_ns: int
    culprit: int | None = None
    collective: str | None = None
    arrival_late_ns: int = 0
    root: dict[str, Any] | None = None
    waits_caused_ns: dict[str, int] = field(default_factory=dict)
    wait_on_culprit_in_step_ns: dict[str, int] = field(default_factory=dict)
    path: list[dict[str, Any]] = field(default_factory=list)
    unexplained_ns: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    steps: StepTable
    table: CollectiveTable
    ledger: Ledger
    ops: OpTable
    links: dict[int, Links]
    slow: set[int]
    baseline: float
    by_step: dict[int, list[Collective]]
    healthy: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    structure: Structure | None = None

    def min_wait(self) -> float:
        return max(MIN_WAIT_NS, MIN_WAIT_REL * self.baseline)

    def healthy_steps(self) -> list[int]:
        return [self.ops.steps[int(i)] for i in self.healthy]


def _median(x: np.ndarray) -> float:
    """Median of a small array (np.median's overhead dominates at these sizes)."""
    v = np.sort(x)
    n = len(v)
    return float(v[n // 2]) if n % 2 else float(0.5 * (v[n // 2 - 1] + v[n // 2]))


def _robust_sigma(x: np.ndarray) -> float:
    if len(x) < 3:
        return 0.0
    return MAD_SIGMA * _median(np.abs(x - _median(x)))


def step_times(steps: StepTable, ledger: Ledger) -> dict[int, int]:
    """Median over ranks of each step's wall time (steps on every rank when any)."""
    walls: dict[int, list[int]] = defaultdict(list)
    for row in ledger.rows:
        walls[row.step].append(row.wall_ns)
    chosen = steps.common or list(walls)
    return {n: int(np.median(walls[n])) for n in chosen if walls.get(n)}


def slow_steps(times: dict[int, int]) -> tuple[set[int], float]:
    if not times:
        return set(), 0.0
    vals = np.array(list(times.values()), dtype=np.float64)
    base = float(np.median(vals))
    if len(vals) < MIN_STEPS_FOR_SLOW:
        return set(), base
    thr = max(SLOW_SIGMAS * _robust_sigma(vals), SLOW_REL * base, MIN_SLOW_NS)
    return {n for n, v in times.items() if v - base > thr}, base


def _determining(ctx: Context, step: int) -> Collective | None:
    """The collective with the most total waiting in the step."""
    best, best_wait = None, 0
    for c in ctx.by_step.get(step, []):
        if not c.waits:
            continue
        total = sum(c.waits.values())
        if total > best_wait:
            best, best_wait = c, total
    return best


def _departs(
    ctx: Context,
    metric: str,
    rank: int,
    step: int,
    key: int,
    value: float,
    wait_ref: float,
    peers_ok: bool = True,
) -> dict[str, Any] | None:
    """How far `value` exceeds peers and history, if beyond every threshold."""
    arr = ctx.ops.dur if metric == "dur" else ctx.ops.gap
    ri, si = ctx.ops.rank_pos(rank), ctx.ops.step_pos(step)
    row = arr[key]
    peers = np.delete(row[:, si], ri) if peers_ok else np.zeros(0)
    peers = peers[~np.isnan(peers)]
    hist = row[ri, ctx.healthy[ctx.healthy != si]]
    hist = hist[~np.isnan(hist)]
    refs = {}
    if len(peers):
        refs["peers"] = _median(peers)
    if len(hist) >= 3:
        refs["history"] = _median(hist)
    if not refs:
        return None
    ref = max(refs.values())
    noise = max(_robust_sigma(peers), _robust_sigma(hist))
    thr = max(NOISE_SIGMAS * noise, REL_EXTRA * ref, MIN_EXTRA_NS, WAIT_SHARE * wait_ref)
    if value - ref <= thr:
        return None
    return {
        "metric": metric,
        "value_ns": int(value),
        "threshold_ns": int(thr),
        **{f"{k}_median_ns": int(v) for k, v in refs.items()},
        "extra_ns": int(value - refs.get("peers", ref)),
        "extra_vs_history_ns": None if "history" not in refs else int(value - refs["history"]),
    }


def _gap_explained(ctx: Context, rank: int, event_start: int, gap: float) -> bool:
    """A gap during which the rank itself waited in a collective is that wait's doing."""
    lo = event_start - gap
    for op in ctx.table.ops.get(rank, []):
        coll = ctx.table.colls[op.coll] if op.coll >= 0 else None
        wait = coll.waits.get(rank, 0) if coll else 0
        if wait and op.start < event_start and op.start + wait > lo:
            return True
    return False


def _describe(ctx: Context, rank: int, j: int, hit: dict[str, Any]) -> dict[str, Any]:
    ops = ctx.ops.per_rank[rank]
    links = ctx.links[rank]
    event = int(ops.event[j])
    t = links.trace
    name = t.names[int(t.name[event])]
    if ops.host_range[j]:
        what = "input_wait"
    elif hit["metric"] == "gap":
        what = "gap before op"
    else:
        what = {0: "kernel", 2: "memcpy", 3: "memset"}.get(int(t.kind[event]), "op")
    return {
        "rank": rank,
        "step": int(ops.step[j]),
        "kind": what,
        "name": name,
        "host_op": links.host_op(event),
        "annotation": links.annotation(event),
        "occurrence": ctx.ops.keys[int(ops.key[j])][1],
        "start_ns": int(ops.start[j]),
        "duration_ns": int(ops.dur[j]),
        "gap_before_ns": int(ops.gap[j]),
        **hit,
    }


def _walk(ctx: Context, rank: int, step: int, until: int, wait_ref: float) -> dict | None:
    """The first departing op of `rank` in `step` that started by `until`, or the
    inserted work that came before it."""
    ops = ctx.ops.per_rank[rank]
    inserted = _inserted_root(ctx, rank, step, wait_ref, until=until)
    limit = until if inserted is None else inserted["start_ns"] - 1
    sel = np.flatnonzero((ops.step == step) & (ops.start <= limit) & ~ops.comm)
    for j in sel:
        key = int(ops.key[j])
        hit = _departs(ctx, "dur", rank, step, key, float(ops.dur[j]), wait_ref)
        if hit is None and not ops.host_range[j] and ops.gap[j] > 0:
            hit = _departs(ctx, "gap", rank, step, key, float(ops.gap[j]), wait_ref)
            if hit and _gap_explained(ctx, rank, int(ops.start[j]), float(ops.gap[j])):
                hit = None
        if hit:
            return _describe(ctx, rank, int(j), hit)
    return inserted


def _insert_threshold(ctx: Context, wait_ref: float) -> float:
    return max(MIN_EXTRA_NS, INSERT_REL * ctx.baseline, WAIT_SHARE * wait_ref)


def _inserted_root(
    ctx: Context,
    rank: int,
    step: int,
    wait_ref: float,
    until: int | None = None,
    peers: bool = True,
) -> dict[str, Any] | None:
    """The first significant run of inserted work of `rank` in `step` (see module doc)."""
    if ctx.structure is None:
        return None
    refs = ctx.structure.references(rank, step, ctx.healthy_steps(), peers)
    thr = _insert_threshold(ctx, wait_ref)
    for run in ctx.structure.runs(rank, step, refs):
        if until is not None and run.start_ns > until:
            break
        if run.extra_ns > thr:
            return _inserted_dict(ctx, run, thr)
    return None


def _inserted_dict(ctx: Context, run: Run, thr: float) -> dict[str, Any]:
    """describe() plus what the run did to the next collective of its rank."""
    root = describe(ctx.ops, ctx.links[run.rank], run)
    root["threshold_ns"] = int(thr)
    nxt = _next_collective(ctx, run.rank, run.step, root["end_ns"])
    root["next_collective"] = None if nxt is None else nxt.label()
    late = nxt is not None and nxt.last_rank == run.rank
    root["waits_at_next_ns"] = (
        {str(r): w for r, w in nxt.waits.items() if r != run.rank} if late and nxt else {}
    )
    root["delay_at_next_ns"] = max(root["waits_at_next_ns"].values(), default=0)
    root["also_in_steps"] = _persists(ctx, run)
    return root


def _next_collective(ctx: Context, rank: int, step: int, after: int) -> Collective | None:
    """The first collective of `rank` in `step` whose op starts after `after`."""
    best = None
    for op in ctx.table.ops.get(rank, []):
        later = op.step == step and op.start >= after and op.coll >= 0
        if later and (best is None or op.start < best.start):
            best = op
    return None if best is None else ctx.table.colls[best.coll]


def _persists(ctx: Context, run: Run) -> list[int]:
    """Later steps in which the rank still runs ops its peers do not (the same fault
    going on; their own history already has them, so only peers are compared)."""
    if ctx.structure is None:
        return []
    s = ctx.structure
    names = set(s.key_token[ctx.ops.per_rank[run.rank].key[run.pos]].tolist())
    out = []
    for n in ctx.ops.steps:
        if n <= run.step:
            continue
        mask = s.inserted(run.rank, n, s.references(run.rank, n, [], peers=True))
        if mask.any() and names & set(s.tokens(run.rank, n)[mask].tolist()):
            out.append(int(n))
    return out


def _earlier_wait(ctx: Context, rank: int, step: int, until: int) -> Collective | None:
    """The latest collective before `until` in which `rank` waited significantly."""
    best = None
    for op in ctx.table.ops.get(rank, []):
        coll = ctx.table.colls[op.coll] if op.coll >= 0 else None
        if coll is None or op.step != step or op.start >= until:
            continue
        if coll.waits.get(rank, 0) >= ctx.min_wait() and (best is None or op.start > best[0]):
            best = (op.start, coll)
    return None if best is None else best[1]


def _waits_in_step(ctx: Context, step: int, culprit: int) -> dict[str, int]:
    return {
        str(r.rank): r.wait_by_peer.get(culprit, 0)
        for r in ctx.ledger.for_step(step)
        if r.rank != culprit
    }


def _slow_step(ctx: Context, step: int, time: int) -> Finding:
    f = Finding("slow_step", step, time, int(ctx.baseline))
    coll = _determining(ctx, step)
    if coll is None or max(coll.waits.values()) < ctx.min_wait():
        return _uniform(ctx, f)
    f.culprit, f.collective = coll.last_rank, coll.label()
    f.arrival_late_ns = max(coll.waits.values())
    f.waits_caused_ns = {str(r): w for r, w in coll.waits.items() if r != coll.last_rank}
    f.wait_on_culprit_in_step_ns = _waits_in_step(ctx, step, coll.last_rank)
    rank, current = coll.last_rank, coll
    for _ in range(MAX_HOPS + 1):
        until = current.ops[rank].start
        f.path.append({"rank": rank, "collective": current.label(), "arrival_ns": until})
        root = _walk(ctx, rank, step, until, f.arrival_late_ns)
        if root:
            f.root = root
            f.unexplained_ns = max(0, f.arrival_late_ns - root["extra_ns"])
            return f
        earlier = _earlier_wait(ctx, rank, step, until)
        if earlier is None or earlier.last_rank == rank:
            break
        rank, current = earlier.last_rank, earlier
    f.unexplained_ns = f.arrival_late_ns
    f.note = (
        f"rank {coll.last_rank} arrived last by {f.arrival_late_ns / 1e6:.2f} ms but no "
        "op before its arrival departs from its peers and its history"
    )
    return f


def _uniform(ctx: Context, f: Finding) -> Finding:
    """A slow step without cross-rank waiting: compare every rank with its history."""
    roots = []
    excess = f.step_time_ns - f.baseline_ns
    for rank in ctx.ops.ranks:
        ops = ctx.ops.per_rank[rank]
        # every rank runs the extra work alike: only the rank's history can show it
        inserted = _inserted_root(ctx, rank, f.step, excess, peers=False)
        limit = np.inf if inserted is None else inserted["start_ns"]
        sel = np.flatnonzero((ops.step == f.step) & ~ops.comm & (ops.start < limit))
        for j in sel:
            hit = _departs(
                ctx, "dur", rank, f.step, int(ops.key[j]), float(ops.dur[j]), excess, peers_ok=False
            )
            if hit:
                roots.append(_describe(ctx, rank, int(j), hit))
                break
        else:
            if inserted is not None:
                roots.append(inserted)
    f.note = "no rank made the others wait: the step is slow on every rank alike"
    if roots:
        common = Counter((r["name"], r["occurrence"]) for r in roots).most_common(1)[0][0]
        chosen = [r for r in roots if (r["name"], r["occurrence"]) == common]
        f.root = dict(chosen[0], ranks=[r["rank"] for r in chosen])
        f.root["extra_ns"] = int(np.median([r["extra_vs_history_ns"] or 0 for r in chosen]))
    f.unexplained_ns = max(0, excess - (f.root["extra_ns"] if f.root else 0))
    return f


def _steady(ctx: Context, times: dict[int, int]) -> Finding | None:
    steady = [n for n in times if n not in ctx.slow]
    if len(steady) < MIN_STEADY_STEPS:
        return None
    last: Counter[int] = Counter()
    waits: dict[int, list[int]] = defaultdict(list)
    for n in steady:
        c = _determining(ctx, n)
        if c is not None and max(c.waits.values()) >= ctx.min_wait():
            last[c.last_rank] += 1
            waits[c.last_rank].append(max(c.waits.values()))
    if not last:
        return None
    rank, count = last.most_common(1)[0]
    if count < STEADY_SHARE * len(steady):
        return None
    f = Finding(
        "steady_state",
        None,
        int(np.median(list(times.values()))),
        int(ctx.baseline),
        culprit=rank,
        arrival_late_ns=int(np.median(waits[rank])),
    )
    f.note = f"rank {rank} arrived last with a significant wait in {count} of {len(steady)} steps"
    f.root = _larger(
        _steady_root(ctx, rank, steady, f.arrival_late_ns),
        _steady_inserted(ctx, rank, steady, f.arrival_late_ns),
    )
    if f.root and f.root["metric"] == "inserted":
        f.waits_caused_ns = dict(f.root["waits_at_next_ns"])
        f.collective = f.root["next_collective"]
        f.wait_on_culprit_in_step_ns = _waits_in_step(ctx, f.root["step"], rank)
    f.unexplained_ns = max(0, f.arrival_late_ns - (f.root["extra_ns"] if f.root else 0))
    return f


def _larger(a: dict | None, b: dict | None) -> dict | None:
    """Of two candidate roots, the one that explains more time."""
    if a is None or b is None:
        return a or b
    return a if a["extra_ns"] >= b["extra_ns"] else b


def _steady_inserted(
    ctx: Context, rank: int, steady: list[int], wait_ref: float
) -> dict[str, Any] | None:
    """Inserted work on the straggler in the first steady step that shows it."""
    for n in sorted(steady):
        root = _inserted_root(ctx, rank, n, wait_ref)
        if root:
            return root
    return None


def _inserted_findings(ctx: Context, times: dict[int, int], named: set[tuple]) -> list[Finding]:
    """Inserted work no other finding names: per rank, the first step that shows it."""
    out = []
    for rank in ctx.ops.ranks:
        for n in ctx.ops.steps:
            if n not in times or not _has_history_and_peers(ctx, rank, n):
                continue
            root = _inserted_root(ctx, rank, n, 0.0)
            if root is None:
                continue
            if (rank, n) not in named:
                out.append(_inserted_finding(ctx, root, times[n]))
            break
    return out


def _has_history_and_peers(ctx: Context, rank: int, step: int) -> bool:
    """Inserted work is claimed only against both references (peers and history)."""
    assert ctx.structure is not None
    refs = ctx.structure.references(rank, step, ctx.healthy_steps())
    return any(r == rank for r, _ in refs) and any(r != rank for r, _ in refs)


def _inserted_finding(ctx: Context, root: dict[str, Any], time: int) -> Finding:
    rank, step = root["rank"], root["step"]
    f = Finding("inserted_work", step, time, int(ctx.baseline), culprit=rank, root=root)
    f.collective = root["next_collective"]
    f.arrival_late_ns = root["delay_at_next_ns"]
    f.waits_caused_ns = dict(root["waits_at_next_ns"])
    f.wait_on_culprit_in_step_ns = _waits_in_step(ctx, step, rank)
    f.unexplained_ns = max(0, f.arrival_late_ns - root["extra_ns"])
    f.note = f"rank {rank} runs work in step {step} that its peers and its own earlier steps do not"
    return f


def _named(findings: list[Finding]) -> set[tuple]:
    return {
        (f.root["rank"], f.root["step"])
        for f in findings
        if f.root and f.root.get("metric") == "inserted"
    }


def _steady_root(ctx: Context, rank: int, steady: list[int], wait_ref: float) -> dict | None:
    """First op whose median excess over its peers across steady steps is significant."""
    ri = ctx.ops.rank_pos(rank)
    cols = [ctx.ops.steps.index(n) for n in steady]
    if len(ctx.ops.ranks) < 2:
        return None
    ops = ctx.ops.per_rank[rank]
    first = np.flatnonzero((ops.step == steady[0]) & ~ops.comm)
    for metric, arr in (("dur", ctx.ops.dur), ("gap", ctx.ops.gap)):
        for j in first:
            sub = arr[int(ops.key[j])][:, cols]
            own = sub[ri]
            peers = np.nanmedian(np.delete(sub, ri, axis=0), axis=0)
            diff = own - peers
            diff = diff[~np.isnan(diff)]
            if len(diff) < MIN_STEADY_STEPS:
                continue
            ref = float(np.nanmedian(peers))
            extra = float(np.median(diff))
            thr = max(
                NOISE_SIGMAS * _robust_sigma(diff),
                REL_EXTRA * ref,
                MIN_EXTRA_NS,
                WAIT_SHARE * wait_ref,
            )
            if extra > thr:
                hit = {
                    "metric": metric,
                    "value_ns": int(np.nanmedian(own)),
                    "peers_median_ns": int(ref),
                    "extra_ns": int(extra),
                    "threshold_ns": int(thr),
                    "extra_vs_history_ns": None,
                }
                return _describe(ctx, rank, int(j), hit)
    return None


def find(
    steps: StepTable, table: CollectiveTable, ledger: Ledger, ops: OpTable, links: dict[int, Links]
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings for every slow step and the steady state, plus the step statistics."""
    times = step_times(steps, ledger)
    slow, base = slow_steps(times)
    by_step: dict[int, list[Collective]] = defaultdict(list)
    for c in table.colls:
        by_step[c.step].append(c)
    healthy = np.array([i for i, n in enumerate(ops.steps) if n not in slow], dtype=np.int64)
    ctx = Context(steps, table, ledger, ops, links, slow, base, by_step, healthy)
    ctx.structure = Structure(ops, links)
    findings = [_slow_step(ctx, n, times[n]) for n in sorted(slow)]
    steady = _steady(ctx, times)
    named = _named(findings + ([steady] if steady else []))
    findings += _inserted_findings(ctx, times, named)
    findings.sort(key=lambda f: (f.step is None, f.step or 0))
    if steady:
        findings.append(steady)
    vals = np.array(list(times.values()), dtype=np.float64)
    stats = {
        "step_times_ns": {str(k): v for k, v in sorted(times.items())},
        "median_ns": int(base),
        "p90_ns": int(np.percentile(vals, 90)) if len(vals) else 0,
        "robust_sigma_ns": int(_robust_sigma(vals)),
        "slow_steps": sorted(slow),
        "structure_alignments": ctx.structure.alignments,
        "structure_search_complete": not ctx.structure.exhausted,
    }
    return findings, stats
