"""Culprits (stragglers of any cause) as Findings, with what blame and cost added."""

from __future__ import annotations

import numpy as np

from rankwatch.detect.base import Context, Culprit
from rankwatch.model import Finding, Since


def costly(ctx: Context, cul: Culprit) -> bool:
    """Worth a finding: its own delays, the job time it cost, or would cost once the
    other stragglers are fixed, reach min_cost_share of the wall time (pair_min_cost_share
    for a rank judged against a single peer: less evidence, so only what matters), and
    its own delays exceed the typical rank's over the same time by that much too
    (later_than_peers_ns). (A slow rank whose delay the job absorbs is still
    reported, with its cost near 0; a blip of a few late ops in a long job is not;
    nor is a rank of a noisy job whose stalls, after two of them happened to come
    in a row, were no more than every rank's.)"""
    wall = ctx.wall_ns
    impact = max(cul.cost_ns, cul.extra.get("cost_alone_ns", 0.0), cul.extra.get("own_ns", 0.0))
    cfg = ctx.config
    share = cfg.pair_min_cost_share if cul.extra.get("pair") else cfg.min_cost_share
    if not wall:
        return True
    # transfer culprits have no own delays to set against their peers'
    later_ok = "peer_own" not in cul.extra or later_than_peers_ns(cul) >= share * wall
    return impact >= share * wall and later_ok


def later_than_peers_ns(cul: Culprit) -> float:
    """The culprit's own delay since its confirmation beyond the median rank's over
    the same time (peers share a job's noise; a straggler's delays are its own)."""
    own = cul.extra.get("own_ns", 0.0)
    peer = cul.extra.get("peer_own")
    if peer is None or len(peer) < 2:
        return own
    return own - float(np.median(np.delete(peer, cul.proc)))


def render(ctx: Context, cul: Culprit) -> Finding:
    """A straggler Finding from a culprit and what blame and cost added to it."""
    topo = ctx.topo
    ex = np.array(cul.excess_ns) if cul.excess_ns else np.zeros(1)
    zs = np.array(cul.z) if cul.z else np.zeros(1)
    wall = ctx.wall_ns
    victims = sorted(cul.victims.items(), key=lambda kv: -kv[1])
    evidence = {
        "onset": {
            "comm": topo.comms[cul.comm].name,
            "func": cul.extra.get("onset_func"),
            "seq": cul.onset_seq,
        },
        "detected_at": {
            "comm": topo.comms[cul.detected_comm].name,
            "func": cul.extra.get("detected_func"),
            "seq": cul.detected_seq,
            "ns": topo.abs_ns(cul.detected_ns),
            "by": cul.extra.get("confirmed_by"),
        },
        "late_ops": cul.hits,
        "median_excess_ns": float(np.median(ex)),
        "median_z": float(np.median(zs)),
        "cause_votes": cul.votes,
        "ops": cul.ops,
        "cost": {
            "s": cul.cost_ns / 1e9,
            "share_of_wall": (cul.cost_ns / wall) if wall else None,
            "alone_s": cul.extra.get("cost_alone_ns", 0.0) / 1e9,
            "steps": cul.cost_segments,
            "total_all_stragglers_s": ctx.total_cost_ns / 1e9,
            "note": "s: job time saved by removing this rank's delays alone; alone_s: what it "
            "costs once the other stragglers are fixed",
        },
        "victims": [
            {
                **topo.who(p),
                "wait_s": w / 1e9,
                "comms": sorted(topo.comms[c].name or "" for c in cul.victim_comms.get(p, ())),
            }
            for p, w in victims[:10]
        ],
        "victims_total": len(victims),
        "victims_wait_s": sum(cul.victims.values()) / 1e9,
        "own_delay_s": cul.extra.get("own_ns", 0.0) / 1e9,
        **({"later_than_peers_s": later_than_peers_ns(cul) / 1e9} if "peer_own" in cul.extra
           else {}),
        **cul.extra.get("evidence", {}),
    }
    conf = float(min(0.99, 0.5 + 0.1 * min(cul.hits, 5) + (0.1 if np.median(zs) > 20 else 0.0)))
    return Finding(
        kind="straggler",
        **topo.who(cul.proc),
        comm=topo.comm_ref(cul.comm),
        since=Since(topo.abs_ns(cul.onset_ns), cul.onset_seq),
        cause=cul.cause,
        cost_s=cul.cost_ns / 1e9,
        confidence=conf,
        evidence=evidence,
    )
