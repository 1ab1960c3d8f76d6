"""Steps: each rank's step windows from its step markers, aligned across ranks by
step number.

A step's measured wall time is its host marker's duration (ProfilerStep#N spans
one `prof.step()` call to the next; NVTX step ranges span what the user wrapped).
Ranks are aligned by the number in the marker. When every rank has markers but
no number is common to all (profilers started at different iterations), the
numbers are re-aligned through a collective sequence number the ranks share.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rankwatch.explain.events import Kind, RankTrace


@dataclass
class RankSteps:
    numbers: np.ndarray  # int64 step numbers, ascending
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns

    def step_at(self, times: np.ndarray) -> np.ndarray:
        """Step number whose window holds each time; -1 outside every window."""
        if len(self.start) == 0:
            return np.full(len(times), -1, dtype=np.int64)
        i = np.searchsorted(self.start, times, side="right") - 1
        ok = (i >= 0) & (times < self.end[np.clip(i, 0, None)])
        return np.where(ok, self.numbers[np.clip(i, 0, None)], -1)


@dataclass
class StepTable:
    ranks: dict[int, RankSteps]
    source: str  # "step markers" or "whole trace (no step markers)"
    numbers: list[int] = field(default_factory=list)  # on at least one rank
    common: list[int] = field(default_factory=list)  # on every rank
    missing: dict[int, list[int]] = field(default_factory=dict)  # step -> ranks without it
    shift: dict[int, int] = field(default_factory=dict)  # rank -> number shift applied
    notes: list[str] = field(default_factory=list)


def _main_track(trace: RankTrace) -> int | None:
    """The thread that holds most step markers (others may be nested copies)."""
    counts = Counter(s.track for s in trace.steps)
    return counts.most_common(1)[0][0] if counts else None


def rank_steps(trace: RankTrace) -> RankSteps:
    """One window per step number (the first marker on the main step thread)."""
    track = _main_track(trace)
    seen: dict[int, tuple[int, int]] = {}
    for s in trace.steps:
        if s.track == track and s.number not in seen and s.end > s.start:
            seen[s.number] = (s.start, s.end)
    nums = sorted(seen)
    return RankSteps(
        np.array(nums, dtype=np.int64),
        np.array([seen[n][0] for n in nums], dtype=np.int64),
        np.array([seen[n][1] for n in nums], dtype=np.int64),
    )


def _whole(trace: RankTrace) -> RankSteps:
    if len(trace.start) == 0:
        return RankSteps(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
    return RankSteps(
        np.array([0], dtype=np.int64),
        np.array([trace.start.min()], dtype=np.int64),
        np.array([trace.end.max()], dtype=np.int64),
    )


def _first_seq_step(trace: RankTrace, steps: RankSteps) -> dict[tuple[str, int], int]:
    """(process group, Seq) -> step number, from collectives that carry Seq."""
    out: dict[tuple[str, int], int] = {}
    idx = np.flatnonzero(trace.meta >= 0)
    idx = idx[np.isin(trace.kind[idx], [int(Kind.COMM_KERNEL), int(Kind.COMM_CPU)])]
    if len(idx) == 0:
        return out
    at = steps.step_at(trace.start[idx])
    for i, step in zip(idx, at, strict=True):
        meta = trace.colls[trace.meta[i]]
        if meta.seq is not None and step >= 0:
            out.setdefault((meta.pg or "", meta.seq), int(step))
    return out


def _realign(traces: list[RankTrace], table: StepTable) -> None:
    """Shift step numbers so that one shared collective falls in the same step."""
    maps = {t.rank: _first_seq_step(t, table.ranks[t.rank]) for t in traces}
    shared = set.intersection(*(set(m) for m in maps.values())) if maps else set()
    if not shared:
        table.notes.append(
            "no step number is on every rank and no collective sequence number links "
            "them: steps are compared by number where they exist"
        )
        return
    key = min(shared, key=lambda k: k[1])
    ref_rank = min(maps)
    for t in traces:
        delta = maps[ref_rank][key] - maps[t.rank][key]
        if delta:
            rs = table.ranks[t.rank]
            table.ranks[t.rank] = RankSteps(rs.numbers + delta, rs.start, rs.end)
            table.shift[t.rank] = delta
    table.notes.append(
        f"step numbers differ between ranks; re-aligned through collective Seq {key[1]} "
        f"(shifts: {table.shift})"
    )


def align_steps(traces: list[RankTrace]) -> StepTable:
    """Step windows of every rank, aligned by number (see module doc)."""
    per = {t.rank: rank_steps(t) for t in traces}
    marked = [r for r, s in per.items() if len(s.numbers)]
    if not marked:
        table = StepTable({t.rank: _whole(t) for t in traces}, "whole trace (no step markers)")
        table.notes.append(
            "no step markers (ProfilerStep#N or NVTX step ranges) in any trace: each "
            "trace is analysed as one window"
        )
    else:
        table = StepTable(per, "step markers")
        for t in traces:
            if t.rank not in marked:
                table.notes.append(f"rank {t.rank} has no step markers: its steps are empty")
        sets = [set(per[r].numbers.tolist()) for r in marked]
        if len(marked) > 1 and not set.intersection(*sets):
            _realign([t for t in traces if t.rank in marked], table)
    _fill(table)
    return table


def _fill(table: StepTable) -> None:
    sets = {r: set(s.numbers.tolist()) for r, s in table.ranks.items()}
    union = set().union(*sets.values()) if sets else set()
    table.numbers = sorted(union)
    table.common = sorted(n for n in union if all(n in s for s in sets.values()))
    table.missing = {
        n: sorted(r for r, s in sets.items() if n not in s)
        for n in table.numbers
        if n not in table.common
    }
    if table.missing:
        some = ", ".join(f"{n} (no rank {v})" for n, v in list(table.missing.items())[:4])
        table.notes.append(f"{len(table.missing)} step(s) are not on every rank: {some}")
