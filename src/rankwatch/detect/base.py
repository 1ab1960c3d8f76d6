"""The detector protocol and what detectors share.

A detector folds a `Window` (the class cohorts completed since the last one,
and the progress records written meanwhile) into its state, and says what it
has concluded so far:

    class Detector(Protocol):
        def feed(self, window: Window) -> None: ...
        def findings(self) -> list[Finding]: ...

Detectors run in the order of `rankwatch.detect.DETECTORS` over the same
window; an earlier one may add columns to `window.cohorts.recs` (desync marks
misaligned records, the straggler detectors mark delays) and entries to the
shared `Context` (culprits, their victims and cost) that later ones read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import numpy as np

from rankwatch.detect.cohorts import Cohorts
from rankwatch.detect.columns import ProgressColumns
from rankwatch.detect.period import SlotMap
from rankwatch.detect.topology import Topology
from rankwatch.errors import ConfigError
from rankwatch.model import Finding


@dataclass(frozen=True)
class Config:
    """Thresholds of the detectors (ns unless named otherwise)."""

    # straggler: a hit is a local segment above the cohort median (and the rank's
    # own baseline for that slot) by z_hit robust sigmas and at least hit_ns
    z_hit: float = 6.0
    hit_ns: float = 150e3
    rel_hit: float = 0.01  # ... and this share of the cohort's median segment
    sigma_floor_ns: float = 10e3
    min_cohort: int = 3  # peers needed (same class, slot and stage) to judge a rank
    learn: int = 4  # observations per (rank, slot) that form its baseline
    # consecutive hits at one slot (one op, consecutive steps) or of one rank (consecutive
    # ops) that fire; 3 keeps rare outliers (a slow kernel now and then, ~1e-3 per op)
    # from ever lining up, even over 1,000 ranks and days of steps
    persist: int = 3
    # ... but two suffice when chance is an unlikely explanation: from the N ops of
    # that kind judged before and their late ones (each beginning a run at its slot),
    # the pairs expected by chance of two late ops in a row at least as late as the
    # smaller of the two and as alike in size (at most their own difference plus an
    # eighth of an octave apart; straggler._chance_pairs); two fire while that is at
    # most chance_runs (0: always `persist`). Noise that stalls ops now and then as
    # badly and at similar sizes keeps three; a clean job, or a delay unlike all but
    # a few stalls seen, fires at two. Not a strict bound on false confirmations: the
    # rule takes both how late and how alike from the pair itself (a look-elsewhere
    # effect); healthy heavy-noise jobs measure it (bench/RESULTS.md section 5): a
    # rank two stalls confirmed by chance is then seldom reported, since a finding
    # needs its delays to exceed its peers' (report.costly). 0.002 confirms fewer by
    # chance and some stragglers a step later.
    chance_runs: float = 0.004
    persist_ops: int = 6  # consecutive late ops of one rank (a delay on every op) that fire
    pair_persist: int = 6  # the same for cohorts of two ranks (see straggler.py)
    pair_persist_ops: int = 0  # 0: off (see straggler.py)
    episode_gap_ops: int = 50  # a rank's ops without a hit that end its slow episode
    # a straggler is reported when its own delays, or the job time it cost, reach this
    # share of the wall time (see report.costly)
    min_cost_share: float = 0.005
    pair_min_cost_share: float = 0.02
    cusum_k: float = 1.5  # CUSUM over z (clipped): finds persistent shifts above ~2 k sigma
    cusum_clip: float = 6.0
    cusum_h: float = 15.0
    host_share: float = 0.5  # arrival moved by this share of the GPU start: cause host
    # transfer: an instance's transfer time above its baseline
    z_xfer: float = 6.0
    xfer_ns: float = 100e3
    rel_xfer: float = 0.25
    xfer_persist: int = 3
    xfer_unexplained_ops: int = 10  # slow ops before a slowdown no rank explains is reported
    # hangs
    hang_min_ns: float = 1e9
    hang_latency_factor: float = 5.0
    # cohorts and windows
    evict_ns: float = 2e9
    recent_segments: int = 8  # what-if keeps this many steps for late confirmations

    def changed(self) -> dict[str, float | int]:
        """The settings that differ from the defaults (a report says what it ran with)."""
        default = Config()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}  # fmt: skip


def config_from(settings: Iterable[str], option: str = "--detect") -> Config:
    """A Config from NAME=VALUE settings (e.g. "chance_runs=0.004"): the names of its
    fields, finite values of their type within the setting's range (_RANGES). A
    name given twice takes the later value. ConfigError names the setting at fault
    and, for an unknown name, lists the known ones."""
    types = {f.name: f.type for f in fields(Config)}
    values: dict[str, float | int] = {}
    for text in settings:
        name, sep, raw = text.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name or not raw:
            raise ConfigError(f"{text!r}: expected NAME=VALUE (chance_runs=0.004)", field=option)
        if name not in types:
            known = ", ".join(sorted(types))
            raise ConfigError(f"{name!r} is not a detector setting ({known})", field=option)
        values[name] = _setting_value(name, raw, types[name], option)
    return replace(Config(), **values)


INT_MAX = 2**31 - 1  # counts beyond this are "never" in any job (and fit every C int)
# (least, most) of a setting; the rest: 0 to INT_MAX for counts, 0 to 1e18 for the
# others (finite: the JSON output carries them). A count of 0 means "off" only where
# the detector says so (pair_persist_ops); elsewhere at least one op is needed.
_RANGES: dict[str, tuple[float, float]] = {
    **{name: (1, INT_MAX) for name in ("persist", "pair_persist", "persist_ops", "xfer_persist",
                                       "episode_gap_ops", "recent_segments",
                                       "xfer_unexplained_ops")},  # fmt: skip
    "learn": (1, 64),  # observations kept per (rank, op): memory grows with it
    "min_cohort": (2, INT_MAX),
    "cusum_h": (1e-9, 1e18),  # a CUSUM threshold of 0 would fire at every op
}


def _setting_value(name: str, raw: str, kind: str, option: str) -> float | int:
    try:
        value: float | int = int(raw) if kind == "int" else float(raw)
    except ValueError:
        what = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"{name}={raw!r}: expected {what}", field=option) from None
    least, most = _RANGES.get(name, (0, INT_MAX if kind == "int" else 1e18))
    if not least <= value <= most:  # also NaN and infinities
        span = f"{_shown(least)} to {_shown(most)}"
        raise ConfigError(f"{name}={raw!r}: expected a value from {span}", field=option)
    return value


def _shown(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e12 else f"{x:g}"


@dataclass
class Culprit:
    """A rank found slow, with what the other detectors add to it."""

    proc: int
    cause: str  # host, gpu, transfer
    comm: int
    onset_seq: int
    onset_ns: float
    detected_seq: int
    detected_ns: float
    detected_comm: int
    votes: dict[str, int] = field(default_factory=dict)
    hits: int = 0
    excess_ns: list[float] = field(default_factory=list)  # a sample, for the evidence
    z: list[float] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    last_ns: float = 0.0
    victims: dict[int, float] = field(default_factory=dict)  # proc -> wait ns caused
    victim_comms: dict[int, set[int]] = field(default_factory=dict)
    cost_ns: float = 0.0
    cost_segments: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    topo: Topology
    config: Config
    slots: SlotMap
    culprits: dict[tuple[int, str], Culprit] = field(default_factory=dict)
    first_ns: float = np.inf
    last_ns: float = -np.inf
    max_latency_ns: float = 0.0  # longest arrival-to-end of a complete op seen
    total_cost_ns: float = 0.0

    @property
    def wall_ns(self) -> float:
        return max(0.0, self.last_ns - self.first_ns) if np.isfinite(self.first_ns) else 0.0


@dataclass
class Window:
    now: float  # stream time: relative ns of the newest record seen
    cohorts: Cohorts | None = None
    progress: ProgressColumns | None = None
    final: bool = False  # the stream ended (records may end without teardown)


class Detector(Protocol):
    def feed(self, window: Window) -> None: ...

    def findings(self) -> list[Finding]: ...
