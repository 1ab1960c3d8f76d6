"""Detectors: stragglers (host, gpu, transfer) with their victims and cost, hangs,
desyncs. One streaming library for stored runs and live monitoring.

    findings = detect(run, clock)          # an aligned Run, offline

    stream = Stream(topology)              # live: the same detectors
    stream.feed(ops=OpColumns(...), progress=ProgressColumns(...))
    ...
    findings = stream.close()

`detect` replays the run's records through a `Stream` in the order a live
monitor receives them, so both give the same findings. Each detector is one
module behind the protocol in `base.py`, listed in DETECTORS (order matters:
later ones read what earlier ones add).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rankwatch.detect.base import Config, Context, Detector, Window
from rankwatch.detect.blame import BlameDetector
from rankwatch.detect.cohorts import Assembler
from rankwatch.detect.columns import OpColumns, ProgressColumns
from rankwatch.detect.cost import CostDetector
from rankwatch.detect.desync import DesyncDetector
from rankwatch.detect.hang import HangDetector
from rankwatch.detect.period import LearnTally, SlotMap, learn_periods
from rankwatch.detect.prepare import Preparer
from rankwatch.detect.records import Recs
from rankwatch.detect.robust import nanmax, nanmin
from rankwatch.detect.straggler import StragglerDetector
from rankwatch.detect.topology import Topology
from rankwatch.detect.transfer import TransferDetector
from rankwatch.model import Finding, Run

if TYPE_CHECKING:
    from rankwatch.align.clock import ClockEstimate

__all__ = [
    "DETECTORS",
    "Config",
    "Detector",
    "OpColumns",
    "ProgressColumns",
    "Stream",
    "Topology",
    "detect",
]

DETECTORS: list[Callable[[Context], Detector]] = [
    DesyncDetector,  # marks misaligned records first
    StragglerDetector,  # host / gpu; marks delays (d_gap)
    TransferDetector,  # transfer; marks slow instances (d_xfer)
    BlameDetector,  # victims of the culprits
    CostDetector,  # what-if job time per culprit
    HangDetector,  # progress records only
]
LEARN_HOLD_NS = 30e9  # live: longest the period learning holds records back
LEARN_MAX_ROWS = 4_000_000  # ... and the most op rows it looks at meanwhile
LEARN_COLUMNS = ("proc", "sym", "msg", "arrival_c")


class Stream:
    """The detectors over a stream of op and progress batches (see module doc)."""

    def __init__(self, topology: Topology, config: Config | None = None, detectors=None) -> None:
        self.topo = topology
        self.ctx = Context(topology, config or Config(), SlotMap())
        self.prepare = Preparer(topology)
        self.assembler = Assembler(topology, self.ctx.config.evict_ns)
        self.detectors: list[Detector] = [make(self.ctx) for make in (detectors or DETECTORS)]
        self.learning = np.zeros(topology.n_procs, dtype=bool)
        self._clear_learning()
        self.hold_since = -np.inf
        self.learned = False
        self.now = -np.inf
        self.closed = False

    def feed(
        self,
        ops: OpColumns | None = None,
        progress: ProgressColumns | None = None,
        now: float | None = None,
    ) -> None:
        """Fold a batch in. Times are relative ns (see columns.py); `now` defaults to
        the newest record."""
        recs = self._take_ops(ops) if ops is not None and len(ops) else None
        if progress is not None and len(progress):
            self.now = max(self.now, nanmax(progress.ts))
        if now is not None:
            self.now = max(self.now, now)
        recs = self._learn(recs, final=False)
        cohorts = self.assembler.feed(recs, self.now) if recs is not None or self.learned else None
        self._run(Window(self.now, self._slotted(cohorts), progress))

    def close(self) -> list[Finding]:
        """End of the stream (end of the stored records, or the live job ended)."""
        if not self.closed:
            recs = self._learn(None, final=True)
            cohorts = self.assembler.feed(recs, self.now, flush=True)
            self._run(Window(self.now, self._slotted(cohorts), None, final=True))
            self.closed = True
        return self.findings()

    def findings(self) -> list[Finding]:
        out = [f for d in self.detectors for f in d.findings()]
        return sorted(out, key=_order)

    def findings_over(self, first_ns: float, last_ns: float) -> list[Finding]:
        """Findings judged against a span at least as long as the one this Stream saw
        (relative ns of its topology): whether a slowdown was worth a finding, and its
        share of the wall time, depend on the wall time it is set against. A live job
        whose Stream a rebuild replaced judges the old one by the whole job's span."""
        ctx = self.ctx
        seen = ctx.first_ns, ctx.last_ns
        ctx.first_ns, ctx.last_ns = min(first_ns, ctx.first_ns), max(last_ns, ctx.last_ns)
        try:
            return self.findings()
        finally:
            ctx.first_ns, ctx.last_ns = seen

    @property
    def span_ns(self) -> tuple[float, float]:
        """(first, last) record time seen, absolute ns on the reference clock (NaN, NaN
        before any op)."""
        if not np.isfinite(self.ctx.first_ns):
            return (np.nan, np.nan)
        t0 = float(self.topo.t0_ns)
        return (t0 + self.ctx.first_ns, t0 + self.ctx.last_ns)

    def retire(self) -> None:
        """Replaced (a live job's rebuild): drop the records it holds; findings stay."""
        self._clear_learning()
        self.assembler = Assembler(self.topo, self.ctx.config.evict_ns)

    @property
    def total_cost_s(self) -> float:
        return self.ctx.total_cost_ns / 1e9

    # ------------------------------------------------------------------ internals
    def _take_ops(self, ops: OpColumns) -> Recs:
        end = np.where(np.isfinite(ops.gend_c), ops.gend_c, ops.arrival_c)
        self.now = max(self.now, nanmax(end))
        self.ctx.first_ns = min(self.ctx.first_ns, nanmin(ops.arrival_c))
        self.ctx.last_ns = max(self.ctx.last_ns, nanmax(end))
        self.ctx.max_latency_ns = max(self.ctx.max_latency_ns, nanmax(ops.gend_c - ops.arrival_c))
        return self.prepare(ops)

    def _learn(self, recs: Recs | None, final: bool) -> Recs | None:
        """Hold the records of op kinds whose period is not known yet (all of them at
        the start; a communicator's created mid-run), learn it from the processes
        that use them, then release them. Learning from those processes' own ops,
        whenever they come, gives the same slots however the records are batched."""
        passed = None
        if recs is not None and len(recs):
            unknown = self.ctx.slots.unknown(recs.sym)
            passed = recs if not unknown.any() else recs.take(np.flatnonzero(~unknown))
            if unknown.any():
                if not self.held:
                    self.hold_since = self.now
                self.learning[np.unique(recs.proc[unknown])] = True
                self.held.append(recs.take(np.flatnonzero(unknown)))
                self.held_syms = np.union1d(self.held_syms, recs.sym[unknown])
            if self.held:  # the full op sequences of the processes learned from
                mine = self.learning[recs.proc]
                part = Recs({c: getattr(recs, c)[mine] for c in LEARN_COLUMNS})
                self.learn_buf.append(part)
                self.tally.add(part)
        if not self.held or not (final or self._enough()):
            return passed if passed is not None and len(passed) else None
        held, syms = Recs.concat(self.held), self.held_syms
        periods = learn_periods(Recs.concat(self.learn_buf), syms)
        self.ctx.slots.add({int(s): periods.get(int(s), 1) for s in syms.tolist()})
        self.learned = True
        self._clear_learning()
        out = Recs.concat([held, passed]) if passed is not None else held
        return out if len(out) else None

    def _clear_learning(self) -> None:
        """Nothing held, nothing learned from: at the start, and once periods are learned."""
        self.held: list[Recs] = []  # records of op kinds whose period is not learned yet
        self.learn_buf: list[Recs] = []  # op sequences of the processes that use them
        self.tally = LearnTally(self.topo.n_procs)  # what learn_buf has, kept as it grows
        self.held_syms = np.zeros(0, dtype=np.int64)  # the kinds of the held records
        self.learning[:] = False

    def _enough(self) -> bool:
        learn_rows = int(self.tally.ops.sum())  # rows in learn_buf
        if self.now - self.hold_since > LEARN_HOLD_NS or learn_rows > LEARN_MAX_ROWS:
            return True
        return self.tally.enough(self.held_syms)

    def _slotted(self, cohorts):
        if cohorts is not None:
            cohorts.recs.slot = self.ctx.slots.codes(cohorts.recs.sym, cohorts.recs.seq)
        return cohorts

    def _run(self, window: Window) -> None:
        for d in self.detectors:
            d.feed(window)


def _order(f: Finding) -> tuple:
    kinds = {"hang": 0, "desync": 1, "straggler": 2}
    return (kinds.get(f.kind, 9), -(f.cost_s or 0.0), f.rank if f.rank is not None else 1 << 30)


def detect(
    run: Run,
    clock: ClockEstimate | None = None,
    config: Config | None = None,
    batch: int = 65536,
) -> list[Finding]:
    """Findings of an aligned Run (after `rankwatch.align.align(run)`).

    `clock` is accepted for symmetry with the other analysis steps; host clock
    bounds are read from the run's host_clock table."""
    from rankwatch.detect.source import windows

    topo = Topology.from_run(run)
    stream = Stream(topo, config)
    if not topo.procs:
        run.meta["detect"] = {"total_cost_s": 0.0, "wall_s": 0.0}
        return []
    for ops, progress, now in windows(run, topo, batch):
        stream.feed(ops, progress, now)
    findings = stream.close()
    run.meta["detect"] = {"total_cost_s": stream.total_cost_s, "wall_s": stream.ctx.wall_ns / 1e9}
    return findings
