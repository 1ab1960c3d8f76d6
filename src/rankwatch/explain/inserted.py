"""Inserted work: GPU ops a rank runs in a step that have no counterpart on its peers
in that step nor on the rank itself in its reference steps.

Duration and gap departures (divergence) compare "the same op" across ranks and
steps; an op that exists on one rank only has nothing to be compared with, so a
rank that runs extra work (a stray matmul, a debug reduction, extra logging
kernels) is invisible to them. Here each rank's step is a sequence of tokens (the
name of every non-communication GPU op, in the order the host launched them:
program order, which does not depend on how streams interleave on the device),
aligned with the same step of up to MAX_PEERS peers and with up to MAX_HISTORY
reference steps of the rank itself by a shortest edit script (Myers' O(ND) diff,
cheap because healthy sequences differ by few edits). An op is inserted when it is
left unmatched by every reference. Unmatched ops whose name the reference lacks at
another position are reorderings, not insertions, and are dropped.

Consecutive inserted ops (allowing MERGE_GAP matched ops in between) form a run;
its extra time is the sum of its GPU op durations.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.explain.events import Kind
from rankwatch.explain.links import Links
from rankwatch.explain.optable import OpTable

MAX_PEERS = 2
MAX_HISTORY = 2
MAX_EDITS = 512  # beyond this many edits the sequences are different programs
MAX_ALIGNMENTS = 400  # non-trivial alignments per analysis (bounds the search's cost)
MERGE_GAP = 2


@dataclass
class Run:
    """Inserted ops of one rank in one step; `pos` indexes the rank's RankOps."""

    rank: int
    step: int
    pos: np.ndarray
    extra_ns: int
    start_ns: int
    before: int | None  # RankOps position of the matched op launched just before
    after: int | None  # ... and just after
    references: list[tuple[int, int]] = field(default_factory=list)  # (rank, step)


def _strip(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """Lengths of the common prefix and (of what remains) the common suffix."""
    n = min(len(a), len(b))
    ne = np.flatnonzero(a[:n] != b[:n])
    pre = int(ne[0]) if len(ne) else n
    ra, rb = a[pre:][::-1], b[pre:][::-1]
    m = min(len(ra), len(rb))
    ne = np.flatnonzero(ra[:m] != rb[:m])
    return pre, int(ne[0]) if len(ne) else m


def _myers(a: list[int], b: list[int], max_d: int) -> tuple[list[int], list[int]] | None:
    """Indices of a and of b outside one longest common subsequence (Myers 1986);
    None when more than max_d edits are needed."""
    n, m = len(a), len(b)
    off = max_d + 1
    v = [0] * (2 * off + 1)
    trace: list[list[int]] = []
    for d in range(max_d + 1):
        trace.append(v[:])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m, d, off)
    return None


def _backtrack(
    trace: list[list[int]], x: int, y: int, d_end: int, off: int
) -> tuple[list[int], list[int]]:
    only_a: list[int] = []
    only_b: list[int] = []
    for d in range(d_end, 0, -1):
        v = trace[d]
        k = x - y
        down = k == -d or (k != d and v[off + k - 1] < v[off + k + 1])
        pk = k + 1 if down else k - 1
        px = v[off + pk]
        py = px - pk
        if down:
            only_b.append(py)
        else:
            only_a.append(px)
        x, y = px, py
    return only_a[::-1], only_b[::-1]


def unmatched(a: np.ndarray, b: np.ndarray, max_d: int = MAX_EDITS) -> np.ndarray | None:
    """Boolean mask over `a`: ops with no counterpart in `b` (reorderings excluded);
    None when the two sequences are too different to align."""
    out = np.zeros(len(a), dtype=bool)
    if len(a) == len(b) and np.array_equal(a, b):
        return out
    pre, suf = _strip(a, b)
    mid_a, mid_b = a[pre : len(a) - suf], b[pre : len(b) - suf]
    if _count_distance(mid_a, mid_b) > max_d:
        return None  # a lower bound on the edits already exceeds the limit
    got = _myers(mid_a.tolist(), mid_b.tolist(), max_d)
    if got is None:
        return None
    only_a, only_b = got
    # An op missing here and extra there is the same op moved, not inserted work.
    moved = Counter(int(mid_b[i]) for i in only_b)
    for i in only_a:
        tok = int(mid_a[i])
        if moved[tok] > 0:
            moved[tok] -= 1
        else:
            out[pre + i] = True
    return out


def _count_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Sum over names of |count in a - count in b|: no edit script is shorter."""
    if len(a) == 0 or len(b) == 0:
        return len(a) + len(b)
    size = int(max(a.max(), b.max())) + 1
    return int(np.abs(np.bincount(a, minlength=size) - np.bincount(b, minlength=size)).sum())


class Structure:
    """Per-rank, per-step op sequences and the inserted work found in them."""

    def __init__(self, ops: OpTable, links: dict[int, Links]) -> None:
        self.ops = ops
        ids: dict[str, int] = {}
        self.key_token = np.array(
            [ids.setdefault(name, len(ids)) for name, _ in ops.keys], dtype=np.int64
        )
        self.alignments = 0
        self.exhausted = False  # some comparisons were skipped: MAX_ALIGNMENTS reached
        self._seq: dict[int, dict[int, np.ndarray]] = {
            r: self._split(r, links[r]) for r in ops.ranks
        }

    def _split(self, rank: int, links: Links) -> dict[int, np.ndarray]:
        """RankOps positions of each step's non-communication GPU ops, in launch order."""
        o = self.ops.per_rank[rank]
        sel = np.flatnonzero(~o.comm & ~o.host_range & (o.step >= 0))
        if len(sel) == 0:
            return {}
        launch, _ = links.launch_times(o.event[sel])
        when = np.where(launch >= 0, launch, o.start[sel])
        order = np.lexsort((when, o.step[sel]))
        sel = sel[order]
        steps = o.step[sel]
        cuts = np.flatnonzero(np.diff(steps)) + 1
        return {int(steps[c0]): chunk for c0, chunk in _chunks(sel, cuts)}

    def positions(self, rank: int, step: int) -> np.ndarray:
        return self._seq.get(rank, {}).get(step, np.zeros(0, dtype=np.int64))

    def tokens(self, rank: int, step: int) -> np.ndarray:
        pos = self.positions(rank, step)
        return self.key_token[self.ops.per_rank[rank].key[pos]]

    def references(
        self, rank: int, step: int, history: list[int], peers: bool = True
    ) -> list[tuple[int, int]]:
        """(rank, step) sequences to compare with: own history first (nearest earlier
        steps, then later ones), then the nearest peers in the same step."""
        own = [n for n in history if n != step and n in self._seq.get(rank, {})]
        own = sorted(own, key=lambda n: (n > step, abs(n - step)))[:MAX_HISTORY]
        refs = [(rank, n) for n in own]
        if peers:
            others = [r for r in self.ops.ranks if r != rank and step in self._seq.get(r, {})]
            refs += [(r, step) for r in sorted(others, key=lambda r: abs(r - rank))[:MAX_PEERS]]
        return refs

    def inserted(self, rank: int, step: int, refs: list[tuple[int, int]]) -> np.ndarray:
        """Mask over the step's sequence: ops unmatched by every reference."""
        tok = self.tokens(rank, step)
        mask = np.ones(len(tok), dtype=bool)
        compared = 0
        for r, n in refs:
            ref = self.tokens(r, n)
            if not (len(tok) == len(ref) and np.array_equal(tok, ref)):
                if self.alignments >= MAX_ALIGNMENTS:
                    self.exhausted = True
                    continue
                self.alignments += 1
            got = unmatched(tok, ref)
            if got is None:
                continue  # a different program (e.g. another pipeline stage): no evidence
            compared += 1
            mask &= got
            if not mask.any():
                break
        return mask if compared else np.zeros(len(tok), dtype=bool)

    def runs(self, rank: int, step: int, refs: list[tuple[int, int]]) -> list[Run]:
        """Runs of inserted ops in launch order (see module doc)."""
        mask = self.inserted(rank, step, refs)
        hit = np.flatnonzero(mask)
        if len(hit) == 0:
            return []
        pos = self.positions(rank, step)
        o = self.ops.per_rank[rank]
        groups = np.split(hit, np.flatnonzero(np.diff(hit) > MERGE_GAP + 1) + 1)
        out = []
        for g in groups:
            members = pos[g[0] : g[-1] + 1][mask[g[0] : g[-1] + 1]]
            before = int(pos[g[0] - 1]) if g[0] > 0 else None
            after = int(pos[g[-1] + 1]) if g[-1] + 1 < len(pos) else None
            out.append(
                Run(
                    rank,
                    step,
                    members,
                    int(o.dur[members].sum()),
                    int(o.start[members].min()),
                    before,
                    after,
                    list(refs),
                )
            )
        return out


def _chunks(sel: np.ndarray, cuts: np.ndarray) -> list[tuple[int, np.ndarray]]:
    bounds = [0, *cuts.tolist(), len(sel)]
    return [(bounds[i], sel[bounds[i] : bounds[i + 1]]) for i in range(len(bounds) - 1)]


# -- description -------------------------------------------------------------------------

MAX_NAMED_KERNELS = 6
_NOT_CONTEXT = ("ProfilerStep", "nccl:", "gloo:")


def _host_chain(links: Links, event: int) -> list[str]:
    """Host operators around the launch of a GPU op, outermost first (aten::matmul,
    aten::mm): the op the user wrote and the one that launched the kernel."""
    t = links.trace
    li = int(links.launch(np.array([event]))[0])
    if li < 0:
        return []
    at, track = int(t.start[li]), int(t.track[li])
    cand = np.flatnonzero(
        (t.kind == int(Kind.CPU_OP)) & (t.track == track) & (t.start <= at) & (t.end > at)
    )
    cand = cand[np.argsort(t.start[cand] - t.end[cand], kind="stable")]  # longest first
    return [t.names[int(t.name[i])] for i in cand]


def _annotation_before(links: Links, event: int) -> str | None:
    """The last annotation (record_function / NVTX / module range) that ended on the
    launching thread before the op was launched: where the program had got to."""
    t = links.trace
    li = int(links.launch(np.array([event]))[0])
    if li < 0:
        return None
    at, track = int(t.start[li]), int(t.track[li])
    kinds = [int(Kind.ANNOTATION), int(Kind.MODULE)]
    cand = np.flatnonzero(np.isin(t.kind, kinds) & (t.track == track) & (t.end <= at))
    # latest start first: the innermost of the ranges that had just closed (layer23,
    # not the DistributedDataParallel.forward around it)
    for i in cand[np.argsort(-t.start[cand], kind="stable")][:64]:
        name = t.names[int(t.name[i])]
        if not name.startswith(_NOT_CONTEXT):
            return name
    return None


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _groups(ops: OpTable, links: Links, run: Run) -> list[dict[str, Any]]:
    """Inserted ops grouped by host operator chain: kernels, counts, GPU time."""
    o = ops.per_rank[run.rank]
    t = links.trace
    by_kernel: dict[str, list[int]] = {}
    for j in run.pos:
        by_kernel.setdefault(t.names[int(t.name[int(o.event[j])])], []).append(int(j))
    groups: dict[str, dict[str, Any]] = {}
    for kernel, js in by_kernel.items():
        chain = _host_chain(links, int(o.event[js[0]]))
        key = " > ".join(chain) or "(no host op)"
        g = groups.setdefault(key, {"host_ops": chain, "count": 0, "gpu_ns": 0, "kernels": []})
        gpu = int(o.dur[js].sum())
        g["kernels"].append({"name": kernel, "count": len(js), "gpu_ns": gpu})
        g["count"] = max(g["count"], len(js))
        g["gpu_ns"] += gpu
    out = sorted(groups.values(), key=lambda g: -g["gpu_ns"])
    for g in out:
        g["kernels"].sort(key=lambda k: -k["gpu_ns"])
        g["kernels"] = g["kernels"][:MAX_NAMED_KERNELS]
    return out


def _neighbour(ops: OpTable, links: Links, rank: int, j: int | None) -> str | None:
    if j is None:
        return None
    event = int(ops.per_rank[rank].event[j])
    chain = _host_chain(links, event)
    ann = links.annotation(event)
    what = chain[0] if chain else _short(links.trace.names[int(links.trace.name[event])])
    return f"{what} (in {ann})" if ann else what


_FUNCTOR = re.compile(r"(\w*Functor\w*)")


def kernel_label(name: str, width: int = 70) -> str:
    """A kernel name short enough to print: without `void `, namespaces and argument
    list, its template arguments reduced to the functor that says what it computes
    (vectorized_elementwise_kernel<8, ...MulFunctor>)."""
    base = name.removeprefix("void ").replace("at::native::", "")
    if name.startswith("void ") or "<" in base.split("(", 1)[0]:
        base = base.split("(", 1)[0]  # a C++ signature: drop its argument list
    if len(base) <= width:
        return base
    head = base.split("<", 1)[0]
    functors = [f for f in _FUNCTOR.findall(base) if f not in ("AUnaryFunctor", "BUnaryFunctor")]
    if functors and "<" in base:
        arg = base.split("<", 1)[1].split(",", 1)[0]
        return _short(f"{head}<{arg}, ...{functors[-1]}>", width)
    return _short(base, width)


def summary(groups: list[dict[str, Any]]) -> str:
    """aten::matmul > aten::mm x12 (nvjet_... x12, Memset (Device) x12), aten::mul_ x12"""
    parts = []
    for g in groups:
        kernels = ", ".join(f"{kernel_label(k['name'])} x{k['count']}" for k in g["kernels"])
        host = " > ".join(g["host_ops"]) or "no host op"
        parts.append(f"{host} x{g['count']} ({kernels})")
    return "; ".join(parts)


def describe(ops: OpTable, links: Links, run: Run) -> dict[str, Any]:
    """A run as a divergence root (the fields divergence and report use)."""
    o = ops.per_rank[run.rank]
    first = int(o.event[int(run.pos[0])])
    groups = _groups(ops, links, run)
    top = groups[0]
    ends = o.start[run.pos] + o.dur[run.pos].astype(np.int64)
    return {
        "rank": run.rank,
        "step": run.step,
        "kind": "inserted_work",
        "metric": "inserted",
        "name": top["host_ops"][-1] if top["host_ops"] else top["kernels"][0]["name"],
        "host_op": " > ".join(top["host_ops"]) or None,
        "annotation": links.annotation(first),
        "after_annotation": _annotation_before(links, first),
        "previous_op": _neighbour(ops, links, run.rank, run.before),
        "next_op": _neighbour(ops, links, run.rank, run.after),
        "ops_count": len(run.pos),
        "groups": groups,
        "compared_with": [list(x) for x in run.references],
        "summary": summary(groups),
        "occurrence": 0,
        "start_ns": run.start_ns,
        "duration_ns": int(ends.max() - run.start_ns),
        "gap_before_ns": 0,
        "value_ns": run.extra_ns,
        "extra_ns": run.extra_ns,
        "extra_vs_history_ns": run.extra_ns,
        "end_ns": int(ends.max()),
    }
