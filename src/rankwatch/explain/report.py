"""The trace analysis as plain data (`summary`, what --json prints) and as text
(`render_text`). Every number in the text comes from the summary, so the two
cannot disagree."""

from __future__ import annotations

from typing import Any

import numpy as np

from rankwatch.explain import collectives
from rankwatch.explain.analysis import TraceAnalysis
from rankwatch.explain.inserted import kernel_label
from rankwatch.explain.ledger import BUCKETS, mean_buckets

SHOWN_PROBLEMS = 20
SHOWN_STEP_ROWS = 2000  # per-step ledger rows in --json beyond which only aggregates remain

BUCKET_TITLES = {
    "compute": "compute",
    "overlapped_comm": "useful overlap",
    "exposed_transfer": "exposed transfer",
    "exposed_wait": "wait on peer",
    "exposed_comm_unsplit": "comm (unmatched)",
    "memcpy": "memcpy",
    "input_wait": "input wait",
    "host_launch_gap": "host launch gap",
    "idle": "idle (queued)",
    "unclassified": "unclassified",
}


SHORT_TITLES = {
    "compute": "compute",
    "overlapped_comm": "overlap",
    "exposed_transfer": "transfer",
    "exposed_wait": "peer wait",
    "exposed_comm_unsplit": "unmatched",
    "memcpy": "memcpy",
    "input_wait": "input",
    "host_launch_gap": "launch gap",
    "idle": "idle",
    "unclassified": "unclassified",
}


def _ms(ns: float | None, signed: bool = False) -> str:
    if ns is None:
        return "n/a"
    return f"{ns / 1e6:+,.2f} ms" if signed else f"{ns / 1e6:,.2f} ms"


def _inputs(a: TraceAnalysis) -> dict[str, Any]:
    return {
        "files": len(a.loaded.files),
        "ranks": [
            {
                "rank": t.rank,
                "file": t.path,
                "format": t.fmt,
                "rank_from": t.rank_source,
                "host": t.host,
                "gpu": t.gpu_name,
                "world_size": t.world_size,
                "events": len(t.kind),
                "schema": t.schema,
            }
            for t in a.traces
        ],
        "problems": [p.to_dict() for p in a.loaded.problems],
    }


def _ledger(a: TraceAnalysis) -> dict[str, Any]:
    rows = a.ledger.rows
    per_rank = {str(r): mean_buckets(a.ledger.for_rank(r)) for r in a.ops.ranks}
    peers: dict[str, float] = {}
    for row in rows:
        for p, v in row.wait_by_peer.items():
            peers[str(p)] = peers.get(str(p), 0.0) + v
    n = max(len(rows), 1)
    return {
        "buckets": list(BUCKETS),
        "reconciled": not a.ledger.check(),
        "check_errors": a.ledger.check()[:10],
        "rows_count": len(rows),
        "job_mean_ns": mean_buckets(rows),
        "per_rank_mean_ns": per_rank,
        "wait_by_peer_mean_ns": {p: v / n for p, v in sorted(peers.items())},
        "visual_overlap_mean_ns": float(np.mean([r.visual_overlap_ns for r in rows] or [0])),
        "unknown_overlap_mean_ns": float(np.mean([r.unknown_overlap_ns for r in rows] or [0])),
        "comm_mean_ns": float(np.mean([r.comm_ns for r in rows] or [0])),
        "cpu_only_ranks": [r for r, g in a.ledger.gpu.items() if not g],
        "rows": [r.to_dict() for r in rows[:SHOWN_STEP_ROWS]],
    }


def summary(a: TraceAnalysis) -> dict[str, Any]:
    """Everything the analysis found, as JSON-ready data."""
    return {
        "input": _inputs(a),
        "steps": {
            "source": a.steps.source,
            "numbers": a.steps.numbers,
            "on_every_rank": a.steps.common,
            "missing": {str(k): v for k, v in a.steps.missing.items()},
            "notes": a.steps.notes,
            **a.step_stats,
        },
        "collectives": collectives.summary(a.table),
        "clock": a.clock.to_dict(),
        "ledger": _ledger(a),
        "findings": [f.to_dict() for f in a.findings],
        "efficiency": a.efficiency,
        "timings_s": a.timings,
    }


# -- text --------------------------------------------------------------------------------


def _input_lines(s: dict[str, Any]) -> list[str]:
    inp = s["input"]
    fmts = sorted({r["format"] for r in inp["ranks"]})
    lines = [f"Input: {len(inp['ranks'])} rank(s) from {inp['files']} file(s) ({', '.join(fmts)})."]
    for r in inp["ranks"][:8]:
        sch = r["schema"]
        feats = [sch.get("time_base", "")]
        if r["format"] == "kineto":
            feats.append(f"distributedInfo {sch.get('distributedInfo')}")
            feats.append(
                "NCCL kernels " + (", ".join(sch.get("nccl_kernel_prefixes") or {}) or "none")
            )
            args = sch.get("collective_args") or []
            feats.append("collective args: " + (", ".join(args) if args else "none"))
        lines.append(f"  rank {r['rank']} ({r['rank_from']}): {'; '.join(f for f in feats if f)}")
    if len(inp["ranks"]) > 8:
        lines.append(f"  ... and {len(inp['ranks']) - 8} more ranks")
    return lines


def _step_lines(s: dict[str, Any]) -> list[str]:
    st = s["steps"]
    times = st.get("step_times_ns", {})
    lines = [
        f"Steps: {len(st['on_every_rank'])} on every rank ({st['source']}); step time "
        f"(median over ranks) median {_ms(st.get('median_ns'))}, p90 {_ms(st.get('p90_ns'))}."
    ]
    slow = st.get("slow_steps") or []
    if slow:
        lines.append("  Slow steps: " + ", ".join(f"{n} ({_ms(times.get(str(n)))})" for n in slow))
    else:
        lines.append("  Slow steps: none.")
    return lines + [f"  note: {n}" for n in st["notes"]]


def _coll_lines(s: dict[str, Any]) -> list[str]:
    c = s["collectives"]
    how = ", ".join(f"group {g}: {m}" for g, m in c["matching"].items()) or "none"
    kinds = ", ".join(f"{k} {v}" for k, v in c["by_collective"].items()) or "none"
    lines = [f"Collectives: {c['collectives']} ({kinds}), matched by {how}."]
    if c["mismatches"]:
        lines.append(f"  DISAGREEMENT in {c['mismatches']} collective(s) (name, size or dtype):")
        for m in c["mismatch_examples"][:5]:
            ranks = "; ".join(f"rank {r}: {v}" for r, v in m["ranks"].items())
            lines.append(f"    step {m['step']} {m['collective']}: others {m['expected']}; {ranks}")
    else:
        lines.append(
            f"  Names, sizes and dtypes agree on all {c['matched_on_several_ranks']} "
            "collectives seen on several ranks."
        )
    if c["incomplete"]:
        lines.append(
            f"  {c['incomplete']} collective(s) missing on some ranks, e.g. "
            f"{c['incomplete_examples'][0]}"
        )
    return lines + [f"  note: {n}" for n in c["notes"]]


def _clock_lines(s: dict[str, Any]) -> list[str]:
    c = s["clock"]
    ranks = c["ranks"]
    if not ranks:
        return ["Clocks: not estimated.", *(f"  note: {n}" for n in c["notes"])]
    if len({r["domain"] for r in ranks}) <= 1:
        return ["Clocks: one clock domain; nothing to align."]
    lines = [
        f"Clocks (offset vs {c['reference']}, estimated from the collectives; the true "
        "offset lies within the bound):"
    ]
    for r in ranks[:16]:
        bound = "unbounded" if r["bound_ns"] is None else f"+- {_ms(r['bound_ns'])}"
        domain = "" if r["domain"] == f"rank {r['rank']}" else f" ({r['domain']})"
        lines.append(f"  rank {r['rank']}{domain}: {_ms(r['offset_ns'], True)} {bound}")
    if c["max_bound_ns"] is not None and c["ordered_fraction"] is not None:
        lines.append(
            f"  Cross-rank order is trustworthy only for gaps above {_ms(2 * c['max_bound_ns'])}: "
            f"{c['ordered_fraction']:.0%} of collectives have arrival spreads that large. The "
            "ledger and the divergence search use durations, not clocks."
        )
    return lines + [f"  note: {n}" for n in c["notes"]]


def _ledger_table(s: dict[str, Any]) -> list[str]:
    led = s["ledger"]
    used = [b for b in BUCKETS if led["job_mean_ns"].get(b, 0) > 0]
    head = f"  {'rank':>6} {'step':>9}" + "".join(f" {SHORT_TITLES[b]:>12}" for b in used)
    lines = [head]
    rows = [(r, m) for r, m in led["per_rank_mean_ns"].items()] + [("all", led["job_mean_ns"])]
    for name, m in rows[:17] if len(rows) <= 17 else [*rows[:16], rows[-1]]:
        cells = "".join(f" {m[b] / 1e6:>12,.2f}" for b in used)
        lines.append(f"  {name:>6} {m['wall'] / 1e6:>9,.2f}{cells}")
    return lines


def _ledger_lines(s: dict[str, Any]) -> list[str]:
    led = s["ledger"]
    ok = "add up exactly to" if led["reconciled"] else "DO NOT add up to"
    lines = [
        f"Ledger (ms, mean per step over {led['rows_count']} rank-steps; the buckets {ok} "
        "the measured step time):",
        *_ledger_table(s),
    ]
    peers = ", ".join(f"rank {p} {_ms(v)}" for p, v in led["wait_by_peer_mean_ns"].items() if v)
    if peers:
        lines.append(f"  Wait on peer, per step, by the rank waited for: {peers}.")
    lines.append(
        f"  Overlap: useful {_ms(led['job_mean_ns'].get('overlapped_comm'))} per step "
        f"(communication transferring while compute runs); visual "
        f"{_ms(led['visual_overlap_mean_ns'])} (communication only waiting under compute: "
        "counted as compute, not as useful overlap)."
    )
    if led["cpu_only_ranks"]:
        lines.append(f"  CPU-only ranks (host timeline): {led['cpu_only_ranks']}")
    for e in led["check_errors"]:
        lines.append(f"  RECONCILIATION ERROR: {e}")
    return lines


def _root_text(root: dict[str, Any]) -> str:
    where = [
        x
        for x in (
            root.get("host_op"),
            f"in {root['annotation']}" if root.get("annotation") else None,
        )
        if x
    ]
    where_text = f" ({', '.join(where)})" if where else ""
    refs = []
    if root.get("peers_median_ns") is not None:
        refs.append(f"{_ms(root['peers_median_ns'])} on peers")
    if root.get("history_median_ns") is not None:
        refs.append(f"{_ms(root['history_median_ns'])} in its own history")
    what = "idle gap before" if root["metric"] == "gap" else root["kind"]
    ranks = f" on ranks {root['ranks']}" if root.get("ranks") else f" on rank {root['rank']}"
    return (
        f"{what} {root['name'][:90]}{where_text}{ranks}, step {root['step']}: "
        f"{_ms(root['value_ns'])} vs {' and '.join(refs)}: {_ms(root['extra_ns'], True)}"
    )


def _steps_text(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))


def _inserted_lines(root: dict[str, Any]) -> list[str]:
    """An inserted-work root: what ran, where, against what, and what it cost."""
    rank = root["rank"]
    own = sorted(n for r, n in root["compared_with"] if r == rank)
    peers = sorted(r for r, _ in root["compared_with"] if r != rank)
    against = []
    if peers:
        who = "rank" if len(peers) == 1 else "ranks"
        against.append(f"{who} {', '.join(map(str, peers))} in step {root['step']}")
    if own:
        against.append(f"rank {rank} in {_steps_text(own)}")
    again = f" (again in {_steps_text(root['also_in_steps'])})" if root["also_in_steps"] else ""
    lines = [
        f"    first divergence: inserted work on rank {rank} in step {root['step']}{again}: "
        f"{root['ops_count']} GPU ops absent from {' and from '.join(against)}:"
    ]
    for g in root["groups"]:
        host = " > ".join(g["host_ops"]) or "no host op"
        kernels = ", ".join(f"{kernel_label(k['name'])} x{k['count']}" for k in g["kernels"])
        lines.append(f"      {host} x{g['count']} ({_ms(g['gpu_ns'])}): {kernels}")
    where = [f"in {root['annotation']}" if root["annotation"] else "outside any annotation"]
    after = [x for x in (root.get("after_annotation"), root.get("previous_op")) if x]
    if after:
        where.append("after " + " and ".join(after))
    if root.get("next_op"):
        where.append(f"before {root['next_op']}")
    lines.append(f"      where: {', '.join(where)}.")
    delay = (
        f"; it arrived last at the next collective, {root['next_collective']}, "
        f"{_ms(root['delay_at_next_ns'])} late"
        if root["delay_at_next_ns"]
        else "; no later collective waited for it"
    )
    lines.append(f"      extra time: {_ms(root['extra_ns'], True)} of GPU time{delay}.")
    return lines


def _finding_head(f: dict[str, Any]) -> str:
    if f["kind"] == "inserted_work":
        return (
            f"  step {f['step']} ({_ms(f['step_time_ns'])}, "
            f"{_ms(f['step_time_ns'] - f['baseline_ns'], True)} vs the median): {f['note']}."
        )
    return ""


def _finding_lines(f: dict[str, Any]) -> list[str]:
    if f["kind"] == "inserted_work":
        head = _finding_head(f)
    elif f["kind"] == "steady_state":
        head = (
            f"  steady state: rank {f['culprit']} makes the others wait "
            f"{_ms(f['arrival_late_ns'])} per step ({f['note']})."
        )
    else:
        head = (
            f"  step {f['step']} ({_ms(f['step_time_ns'])}, "
            f"{_ms(f['step_time_ns'] - f['baseline_ns'], True)} over the median): "
        )
        if f["culprit"] is not None:
            head += (
                f"rank {f['culprit']} arrived last at {f['collective']}, "
                f"{_ms(f['arrival_late_ns'])} late."
            )
        else:
            head += f["note"] + "."
    lines = [head]
    if f["root"] and f["root"]["metric"] == "inserted":
        lines += _inserted_lines(f["root"])
    elif f["root"]:
        lines.append(f"    first divergence: {_root_text(f['root'])}.")
    elif f["culprit"] is not None:
        lines.append(f"    no op departs: {f['note']}.")
    if f["waits_caused_ns"]:
        waits = ", ".join(f"rank {r} {_ms(v)}" for r, v in f["waits_caused_ns"].items())
        at = f" ({f['collective']})" if f["collective"] else ""
        lines.append(f"    waits it caused at that collective{at}: {waits}.")
    if len(f["path"]) > 1:
        hops = " <- ".join(f"rank {p['rank']} at {p['collective']}" for p in f["path"])
        lines.append(f"    followed: {hops}")
    lines.append(f"    unexplained: {_ms(f['unexplained_ns'])}.")
    return lines


def _findings_lines(s: dict[str, Any]) -> list[str]:
    fs = s["findings"]
    if not fs:
        return [
            "First unexplained divergence: none (no slow step, no persistent straggler, "
            "no inserted work)."
        ]
    lines = ["First unexplained divergence:"]
    for f in fs[:12]:
        lines += _finding_lines(f)
    if len(fs) > 12:
        lines.append(f"  ... and {len(fs) - 12} more (see --json)")
    if not any(f["kind"] == "steady_state" for f in fs):
        lines.append("  steady state: no persistent straggler.")
    return lines


def _ratio_line(r: dict[str, Any]) -> str:
    return (
        f"  {r['name']} = {r['numerator']:.4g} {r['numerator_text']} / ({r['denominator_text']})"
        f" = {r['numerator']:.4g} / {r['denominator']:.4g} = {r['value']:.1%}"
    )


def _efficiency_lines(s: dict[str, Any]) -> list[str]:
    e = s["efficiency"]
    lines = ["Efficiency:"]
    for key in ("mfu", "hfu"):
        if key in e:
            lines.append(_ratio_line(e[key]))
    if "model_flops" in e:
        lines.append(f"    model FLOPs per step: {e['model_flops']['from']}")
    if "hardware_flops" in e:
        lines.append(f"    hardware FLOPs per step: {e['hardware_flops']['from']}")
    for row in e.get("busbw", []):
        ref = (
            ""
            if row["efficiency"] is None
            else f" / {row['reference_gbs']:.1f} GB/s {row['reference']} = {row['efficiency']:.0%}"
        )
        lines.append(
            f"  bus bandwidth, {row['collective']} {row['size_class']} ({row['count']} "
            f"ops, transfer only): {row['busbw_gbs']:.1f} GB/s{ref}"
        )
    lines += [f"  note: {n}" for n in e.get("notes", [])]
    return lines


def _problem_lines(s: dict[str, Any]) -> list[str]:
    probs = s["input"]["problems"]
    if not probs:
        return ["Problems while reading: none."]
    lines = [f"Problems while reading ({len(probs)}; the other ranks were analysed):"]
    for p in probs[:SHOWN_PROBLEMS]:
        where = p["file"] if p["line"] is None else f"{p['file']}:{p['line']}"
        lines.append(f"  {where}: {p['message']}")
    return lines


def render_text(s: dict[str, Any]) -> str:
    sections = (
        _input_lines,
        _step_lines,
        _coll_lines,
        _clock_lines,
        _ledger_lines,
        _findings_lines,
        _efficiency_lines,
        _problem_lines,
    )
    return "\n".join(line for sec in sections for line in sec(s)) + "\n"
