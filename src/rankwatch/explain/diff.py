"""`compare(before, after)`: where a step-time change between two runs went.

* Step time: median and mean of the per-step times (median over ranks).
* By ledger bucket: the mean of every bucket over all rank-steps. The buckets of
  every rank-step add up to its wall time, so the bucket changes add up to the
  change of the mean rank-step wall time (exactly, up to float rounding); what
  moved into `unclassified` is the part the traces cannot explain.
* By rank: each rank's mean wall time and buckets, before and after.
* By op: GPU time per step of each op name (mean over ranks), before and after; the
  sum over ops is kernel time, which differs from the compute bucket by kernel
  overlap, and the text says by how much.
* First divergent op: ops matched by (name, occurrence in the step); the first one
  in step order whose median duration (or idle gap before it) moved by more than
  NOISE_SIGMAS robust sigmas of either run, REL_SHIFT and MIN_SHIFT_NS; with the
  ranks on which it moved (all ranks: a software change; some: those ranks).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from rankwatch.explain.analysis import TraceAnalysis
from rankwatch.explain.ledger import BUCKETS, mean_buckets

NOISE_SIGMAS = 5.0
REL_SHIFT = 0.05
MIN_SHIFT_NS = 20_000
SHOWN_OPS = 12
MAD_SIGMA = 1.4826


def _ms(ns: float | None, signed: bool = False) -> str:
    if ns is None:
        return "n/a"
    return f"{ns / 1e6:+,.2f} ms" if signed else f"{ns / 1e6:,.2f} ms"


def _sigma(x: np.ndarray) -> float:
    return float(MAD_SIGMA * np.median(np.abs(x - np.median(x)))) if len(x) >= 3 else 0.0


def _op_time(a: TraceAnalysis) -> dict[str, float]:
    """GPU (or host, on CPU-only ranks) time per step of every op name, mean over ranks."""
    total: dict[str, float] = defaultdict(float)
    for t in a.traces:
        ops = a.ops.per_rank[t.rank]
        steps = max(len(a.steps.ranks[t.rank].numbers), 1)
        inside = (ops.step >= 0) & ~ops.host_range
        names = t.name[ops.event[inside]]
        sums = np.bincount(names, weights=ops.dur[inside], minlength=len(t.names))
        comm = np.bincount(names, weights=ops.comm[inside], minlength=len(t.names))
        for i in np.flatnonzero(sums):
            kind = "comm" if comm[i] else "op"
            total[f"{kind}\t{t.names[i]}"] += sums[i] / steps
    n = max(len(a.traces), 1)
    return {k: v / n for k, v in total.items()}


def _by_op(before: TraceAnalysis, after: TraceAnalysis) -> list[dict[str, Any]]:
    b, a = _op_time(before), _op_time(after)
    rows = []
    for key in set(a) | set(b):
        kind, name = key.split("\t", 1)
        rows.append(
            {
                "op": name,
                "communication": kind == "comm",
                "before_ns": b.get(key, 0.0),
                "after_ns": a.get(key, 0.0),
                "delta_ns": a.get(key, 0.0) - b.get(key, 0.0),
            }
        )
    rows.sort(key=lambda r: -abs(r["delta_ns"]))
    return rows


def _order(after: TraceAnalysis) -> list[tuple[str, int]]:
    """Op keys in the order they run within a step (median offset from step start)."""
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for t in after.traces:
        ops = after.ops.per_rank[t.rank]
        rs = after.steps.ranks[t.rank]
        for n, lo in zip(rs.numbers[:8], rs.start[:8], strict=False):
            sel = np.flatnonzero(ops.step == n)
            for j in sel:
                offsets[after.ops.keys[int(ops.key[j])]].append(int(ops.start[j] - lo))
    return sorted(offsets, key=lambda k: np.median(offsets[k]))


def _shift(bv: np.ndarray, av: np.ndarray) -> tuple[float, float] | None:
    """(median shift, threshold it must exceed) of one op's values between runs."""
    bv, av = bv[~np.isnan(bv)], av[~np.isnan(av)]
    if len(bv) == 0 or len(av) == 0:
        return None
    shift = float(np.median(av) - np.median(bv))
    noise = NOISE_SIGMAS * max(_sigma(bv), _sigma(av))
    return shift, max(noise, REL_SHIFT * float(np.median(bv)), MIN_SHIFT_NS)


def _moved(
    before: TraceAnalysis, after: TraceAnalysis, kb: int, ka: int, metric: str
) -> list[tuple[int, float, float, float, float]]:
    """Ranks on which op key (kb in before, ka in after) moved, with their shifts."""
    arr_b = before.ops.dur if metric == "dur" else before.ops.gap
    arr_a = after.ops.dur if metric == "dur" else after.ops.gap
    out = []
    for r in after.ops.ranks:
        if r not in before.ops.ranks:
            continue
        bv, av = arr_b[kb, before.ops.rank_pos(r)], arr_a[ka, after.ops.rank_pos(r)]
        got = _shift(bv, av)
        if got and got[0] > got[1]:
            out.append((r, got[0], got[1], float(np.nanmedian(bv)), float(np.nanmedian(av))))
    return out


def _comm_names(x: TraceAnalysis) -> set[str]:
    names: set[str] = set()
    for t in x.traces:
        ops = x.ops.per_rank[t.rank]
        names.update(t.names[i] for i in np.unique(t.name[ops.event[ops.comm]]))
    return names


def first_divergent_op(before: TraceAnalysis, after: TraceAnalysis) -> dict[str, Any] | None:
    """The first op (in step order) whose duration or preceding gap moved on any rank.
    Communication ops are left out: their duration includes waiting for peers, which
    is a symptom; a slower transfer shows in transfer_changes."""
    kb = {key: k for k, key in enumerate(before.ops.keys)}
    ka = {key: k for k, key in enumerate(after.ops.keys)}
    comm = _comm_names(before) | _comm_names(after)
    for key in _order(after):
        if key[0] in comm or key not in kb:
            continue
        for metric in ("dur", "gap"):
            moved = _moved(before, after, kb[key], ka[key], metric)
            if moved:
                return {
                    "name": key[0],
                    "occurrence": key[1],
                    "metric": metric,
                    "ranks": [m[0] for m in moved],
                    "shift_ns": float(np.median([m[1] for m in moved])),
                    "threshold_ns": float(np.median([m[2] for m in moved])),
                    "before_median_ns": float(np.median([m[3] for m in moved])),
                    "after_median_ns": float(np.median([m[4] for m in moved])),
                }
    return None


def transfer_changes(before: TraceAnalysis, after: TraceAnalysis) -> list[dict[str, Any]]:
    """Transfer-only time of the collectives, per collective and size class."""
    from rankwatch.explain.efficiency import size_class

    def groups(x: TraceAnalysis) -> dict[tuple[str, str], np.ndarray]:
        acc: dict[tuple[str, str], list[float]] = defaultdict(list)
        for c in x.table.colls:
            if c.transfer_ns is not None:
                acc[(c.meta.family, size_class(c.meta.nbytes() or 0))].append(c.transfer_ns)
        return {k: np.array(v, dtype=np.float64) for k, v in acc.items()}

    gb, ga = groups(before), groups(after)
    rows = []
    for key in sorted(set(gb) & set(ga)):
        shift, thr = _shift(gb[key], ga[key]) or (0.0, 0.0)
        rows.append(
            {
                "collective": key[0],
                "size_class": key[1],
                "before_ns": float(np.median(gb[key])),
                "after_ns": float(np.median(ga[key])),
                "shift_ns": shift,
                "significant": abs(shift) > thr,
            }
        )
    return rows


def _per_rank(before: TraceAnalysis, after: TraceAnalysis) -> list[dict[str, Any]]:
    rows = []
    for r in sorted(set(before.ops.ranks) & set(after.ops.ranks)):
        mb, ma = mean_buckets(before.ledger.for_rank(r)), mean_buckets(after.ledger.for_rank(r))
        rows.append({"rank": r, "before": mb, "after": ma, "delta": {k: ma[k] - mb[k] for k in ma}})
    return rows


def _step_time(x: TraceAnalysis) -> dict[str, float]:
    vals = np.array([float(v) for v in x.step_stats.get("step_times_ns", {}).values()])
    return {
        "median_ns": float(np.median(vals)) if len(vals) else 0.0,
        "mean_ns": float(np.mean(vals)) if len(vals) else 0.0,
        "steps": len(vals),
    }


def compare(before: TraceAnalysis, after: TraceAnalysis) -> dict[str, Any]:
    """The diff (see module doc) as plain data."""
    mb, ma = mean_buckets(before.ledger.rows), mean_buckets(after.ledger.rows)
    delta = {b: ma[b] - mb[b] for b in BUCKETS}
    ops = _by_op(before, after)
    kernel_delta = sum(r["delta_ns"] for r in ops if not r["communication"])
    result = {
        "step_time": {"before": _step_time(before), "after": _step_time(after)},
        "rank_step_wall": {
            "before_ns": mb["wall"],
            "after_ns": ma["wall"],
            "delta_ns": ma["wall"] - mb["wall"],
        },
        "buckets": {
            b: {"before_ns": mb[b], "after_ns": ma[b], "delta_ns": delta[b]} for b in BUCKETS
        },
        "buckets_sum_delta_ns": sum(delta.values()),
        "unexplained_ns": delta["unclassified"],
        "by_rank": _per_rank(before, after),
        "by_op": ops[: SHOWN_OPS * 4],
        "op_vs_compute_ns": kernel_delta - delta["compute"] - delta["overlapped_comm"],
        "first_divergent_op": first_divergent_op(before, after),
        "transfer_changes": transfer_changes(before, after),
        "findings_after": [f.to_dict() for f in after.findings],
        "ranks": {"before": before.ops.ranks, "after": after.ops.ranks},
    }
    return result


def render_diff(d: dict[str, Any]) -> str:
    st = d["step_time"]
    lines = [
        f"Step time: {_ms(st['before']['median_ns'])} -> {_ms(st['after']['median_ns'])} "
        f"(median, {_ms(st['after']['median_ns'] - st['before']['median_ns'], True)}); mean "
        f"{_ms(st['before']['mean_ns'])} -> {_ms(st['after']['mean_ns'])}.",
        f"Where it went (mean per rank-step; the buckets add up to the "
        f"{_ms(d['rank_step_wall']['delta_ns'], True)} change of the mean step):",
    ]
    for b, v in sorted(d["buckets"].items(), key=lambda kv: -abs(kv[1]["delta_ns"])):
        if abs(v["delta_ns"]) >= 1_000:
            lines.append(
                f"  {b:<22} {_ms(v['before_ns']):>12} -> {_ms(v['after_ns']):>12}  "
                f"{_ms(v['delta_ns'], True):>12}"
            )
    lines.append(f"  unexplained (unclassified): {_ms(d['unexplained_ns'], True)}")
    lines.append("By rank (change of mean step, compute, wait on peer):")
    for r in d["by_rank"][:16]:
        dd = r["delta"]
        lines.append(
            f"  rank {r['rank']}: {_ms(dd['wall'], True)}, compute "
            f"{_ms(dd['compute'], True)}, wait {_ms(dd['exposed_wait'], True)}"
        )
    lines.append("By op (GPU time per step, mean over ranks; communication includes waiting):")
    for r in d["by_op"][:SHOWN_OPS]:
        if abs(r["delta_ns"]) < 1_000:
            break
        tag = " [comm]" if r["communication"] else ""
        lines.append(f"  {_ms(r['delta_ns'], True):>12}  {r['op'][:100]}{tag}")
    lines.append(
        f"  (kernel time minus compute-bucket change: {_ms(d['op_vs_compute_ns'], True)}"
        " of kernel overlap, not step time)"
    )
    f = d["first_divergent_op"]
    if f:
        what = "idle gap before" if f["metric"] == "gap" else "duration of"
        lines.append(
            f"First divergent op: {what} {f['name'][:100]} (occurrence {f['occurrence']} "
            f"in the step): {_ms(f['before_median_ns'])} -> {_ms(f['after_median_ns'])} "
            f"({_ms(f['shift_ns'], True)}) on ranks {f['ranks']}."
        )
    else:
        lines.append("First divergent op: none beyond run-to-run noise.")
    for t in d["transfer_changes"]:
        if t["significant"]:
            lines.append(
                f"Collective transfer time changed: {t['collective']} {t['size_class']} "
                f"{_ms(t['before_ns'])} -> {_ms(t['after_ns'])}."
            )
    return "\n".join(lines) + "\n"
