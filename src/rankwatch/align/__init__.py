"""Cross-rank alignment: who is who, host clocks, and ops matched across ranks.

`align(run)` adds to a Run (tables in DuckDB; made with SQL, or with the compiled
kernels of kernels.py where the native reader kept the collectives' columns):
communicators, processes, rank_map (ranks.py); host_clock (clock.py);
ops_aligned, collectives, collective_ranks, rank_lateness (collectives.py);
p2p_pairs (p2p.py). It returns the clock estimate, whose bounds callers must
respect before claiming an arrival order across hosts.
"""

from __future__ import annotations

from rankwatch.align import groups
from rankwatch.align.clock import ClockEstimate, HostClock, estimate_clocks, observe
from rankwatch.align.collectives import finish_collectives, start_collectives
from rankwatch.align.p2p import align_p2p
from rankwatch.align.ranks import map_ranks
from rankwatch.alloc import release_freed_memory
from rankwatch.model import Run

__all__ = ["ClockEstimate", "HostClock", "align", "estimate_clocks"]


def align(run: Run) -> ClockEstimate:
    """Map ranks, estimate host clocks, and align collectives and P2P ops.

    The compiled kernels (kernels.py) run on threads of their own while SQL that
    does not need their results runs here: the clock's observations while ranks are
    mapped, the collectives while the P2P ops are aligned."""
    groups.make(run)
    observing = observe(run)
    map_ranks(run, recount=False)
    clock = estimate_clocks(run, observing)
    aligning = start_collectives(run)
    align_p2p(run)
    finish_collectives(run, aligning)
    release_freed_memory()  # the kernels' threads' arenas: see there
    return clock
