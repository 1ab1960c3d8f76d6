"""Links inside one rank's trace: GPU op -> the runtime call that launched it
(correlation id), op -> host operator (External id), time -> enclosing annotation.

Built once per rank from sorted arrays, so a lookup is a binary search, not a
scan; the per-op lookups (names for reports) are only done for the few ops a
report shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.explain.events import Kind, RankTrace
from rankwatch.explain.steps import RankSteps

STEP_PREFIXES = ("ProfilerStep",)


@dataclass
class Links:
    trace: RankTrace
    rt_corr: np.ndarray  # sorted correlation ids of runtime calls
    rt_index: np.ndarray  # their event indices

    @classmethod
    def build(cls, trace: RankTrace) -> Links:
        rt = trace.select(Kind.RUNTIME)
        rt = rt[trace.corr[rt] >= 0]
        order = np.argsort(trace.corr[rt], kind="stable")
        return cls(trace, trace.corr[rt][order], rt[order])

    def launch(self, idx: np.ndarray) -> np.ndarray:
        """Event index of the runtime call that launched each GPU op; -1 if unknown."""
        corr = self.trace.corr[idx]
        pos = np.searchsorted(self.rt_corr, corr)
        pos_c = np.clip(pos, 0, max(len(self.rt_corr) - 1, 0))
        if len(self.rt_corr) == 0:
            return np.full(len(idx), -1, dtype=np.int64)
        hit = (corr >= 0) & (pos < len(self.rt_corr)) & (self.rt_corr[pos_c] == corr)
        return np.where(hit, self.rt_index[pos_c], -1)

    def launch_times(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of each GPU op's launch call; -1 where unknown."""
        li = self.launch(idx)
        safe = np.clip(li, 0, None)
        start = np.where(li >= 0, self.trace.start[safe], -1)
        end = np.where(li >= 0, self.trace.end[safe], -1)
        return start, end

    def host_op(self, event: int) -> str | None:
        """The host operator behind an event: same External id, innermost first."""
        t = self.trace
        ext = int(t.ext[event])
        if ext < 0:
            return None
        kinds = [int(Kind.CPU_OP), int(Kind.COMM_CPU)]
        cand = np.flatnonzero((t.ext == ext) & np.isin(t.kind, kinds))
        if len(cand) == 0:
            return None
        shortest = cand[np.argmin(t.end[cand] - t.start[cand])]
        return t.names[int(t.name[shortest])]

    def annotation(self, event: int) -> str | None:
        """The innermost annotation (record_function / NVTX / nn.Module range) around
        the event's launch on the host, else around the event on its GPU stream."""
        t = self.trace
        li = int(self.launch(np.array([event]))[0])
        host_time, host_track = (int(t.start[li]), int(t.track[li])) if li >= 0 else (None, None)
        if host_time is None and not t.tracks[int(t.track[event])].gpu:
            host_time, host_track = int(t.start[event]), int(t.track[event])
        if host_time is not None:
            kinds = [int(Kind.ANNOTATION), int(Kind.MODULE)]
            got = self._innermost(kinds, host_time, host_track)
            if got:
                return got
        return self._innermost([int(Kind.GPU_ANNOTATION)], int(t.start[event]), None)

    def _innermost(self, kinds: list[int], time: int, track: int | None) -> str | None:
        t = self.trace
        mask = np.isin(t.kind, kinds) & (t.start <= time) & (t.end > time)
        if track is not None:
            mask &= t.track == track
        cand = np.flatnonzero(mask)
        names = [(int(t.end[i] - t.start[i]), t.names[int(t.name[i])]) for i in cand]
        names = [x for x in names if not x[1].startswith(STEP_PREFIXES)]
        return min(names)[1] if names else None


def event_steps(trace: RankTrace, links: Links, steps: RankSteps, idx: np.ndarray) -> np.ndarray:
    """The step each event belongs to: the step its launch happened in on the host
    (GPU work runs behind the host), else the step its own start falls in."""
    launch_start, _ = links.launch_times(idx)
    when = np.where(launch_start >= 0, launch_start, trace.start[idx])
    return steps.step_at(when)
