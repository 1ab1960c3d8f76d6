"""Sections of the HTML report below the summary: figures with their captions and
tables, or a sentence saying why a figure is missing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from markupsafe import Markup

from rankwatch.export import html_data as data
from rankwatch.export import html_figures as figures
from rankwatch.export.html_text import duration
from rankwatch.model import Run

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
BANDWIDTH_ROWS = 60
PROBLEM_ROWS = 100
NO_TIMES_NOTE = (
    "Not available: the records carry no timestamps (NCCL Inspector logs without event "
    "traces have none), so the ranks cannot be lined up in time."
)
NO_OPS_NOTE = "Not available: there are no op records, only state records."
NO_SHARED_NOTE = "Not available: no collective was recorded by two or more ranks."
PHASE_WORDS = {"gpu_start": "GPU start", "arrival": "enqueue (NCCL call)"}


@dataclass
class Figure:
    """One figure as the template places it."""

    id: str
    title: str
    caption: str
    html: Markup


def figure(fig: go.Figure, div_id: str, title: str, caption: str) -> Figure:
    """A Plotly figure as an HTML fragment (no plotly.js: the page carries it once)."""
    fragment = fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config=PLOT_CONFIG,
        default_width="100%",
        default_height=f"{fig.layout.height or 450}px",
    )
    return Figure(div_id, title, caption, Markup(fragment))


def timeline_section(
    run: Run,
    world: dict[str, Any],
    t0: int | None,
    gaps: dict[str, int],
    late: list[int],
    delays: data.OpDelays | None,
) -> dict[str, Any]:
    """The three-row plot per function (world communicator first), or why there is none."""
    name = f" ({world['name']})" if world.get("name") else ""
    figs = [
        figure(
            figures.timeline_figure(t, late),
            f"fig-timeline-{i}",
            timeline_title(t, name),
            timeline_caption(t, late),
        )
        for i, t in enumerate(data.timelines(run, world.get("key"), delays))
    ]
    note = None
    if not figs:
        note = no_timeline_note(gaps, t0, world)
    return {"timelines": figs, "timeline_note": note}


def timeline_title(t: data.Timeline, world_label: str) -> str:
    if t.world:
        return f"{t.func} on the world communicator{world_label}"
    return f"{t.func} on the other {t.comms} communicator{'s' if t.comms > 1 else ''}"


def timeline_caption(t: data.Timeline, late: list[int]) -> str:
    peers = "the earliest rank of the same op"
    if not t.world:
        peers += " on its own communicator"
    if t.ops_per_point == 1:
        points = "Each dot is one op."
    elif t.ops_per_point:
        points = (
            f"Each dot is the largest delay in a run of {t.ops_per_point:,} consecutive "
            "ops (keeps the file small; no spike is averaged away)."
        )
    else:
        points = (
            f"Each dot is the rank's largest delay in a {duration((t.bucket_s or 0) * 1e9)}"
            " slice of the job (keeps the file small; no spike is averaged away)."
        )
    if any(figures.delay_axis_top(t.delay_us[p]) is not None for p in range(3)):
        points += " Rare spikes above a y axis are cut off: double-click the plot to see all."
    shown, rest = figures.pick_ranks(t, late)
    ranks = (
        f"The {len(shown)} ranks drawn are the job's most-late ranks and the latest here; "
        f"the grey band spans the other {len(rest)}."
        if len(rest)
        else "Click a rank in the legend to hide it."
    )
    return (
        f"{t.ops:,} collectives. Delay of each rank behind {peers}, for the NCCL call, "
        f"the GPU start and the GPU end. {points} {ranks}"
    )


def no_timeline_note(gaps: dict[str, int], t0: int | None, world: dict[str, Any]) -> str:
    if not gaps["ops"]:
        return NO_OPS_NOTE
    if t0 is None or gaps["untimed"] == gaps["ops"]:
        return NO_TIMES_NOTE + " The per-rank timelines are left out."
    if not world:
        return "Not available: no communicator was found."
    return (
        f"Not available: the world communicator ({world.get('name') or 'unnamed'}) "
        "recorded no collectives with timestamps."
    )


def no_heatmap_note(gaps: dict[str, int], t0: int | None) -> str:
    if not gaps["ops"]:
        return NO_OPS_NOTE
    return NO_TIMES_NOTE if t0 is None else NO_SHARED_NOTE


def heatmap_caption(g: data.LatenessGrid) -> str:
    return (
        f"Mean delay of each rank's {PHASE_WORDS[g.phase]} behind the earliest rank of each "
        "op, over every collective that two or more ranks recorded (all communicators), in "
        f"{len(g.time_s):,} slices of the job with equal numbers of collectives (about "
        f"{g.per_slice:,} each). Colours stop at the 99th percentile."
    )


def heatmap_section(
    t0: int | None, gaps: dict[str, int], delays: data.OpDelays | None
) -> dict[str, Any]:
    """The rank x time lateness heatmap, or why there is none."""
    grid = data.lateness_grid(delays)
    if grid is None:
        return {"heatmap": None, "heatmap_note": no_heatmap_note(gaps, t0)}
    fig = figure(
        figures.heatmap_figure(grid),
        "fig-lateness-heatmap",
        "Lateness by rank over time",
        heatmap_caption(grid),
    )
    return {"heatmap": fig, "heatmap_note": None}


def bandwidth_section(run: Run) -> dict[str, Any]:
    source, rows = data.bandwidth(run)
    if source == "none":
        return {
            "bandwidth": None,
            "bandwidth_note": "No collective has a known bandwidth.",
            "bandwidth_rows": [],
            "bandwidth_more": 0,
        }
    caption = (
        "From each collective's transfer time (GPU end of the first rank to finish minus "
        "GPU start of the last to start, when clocks allow; else the shortest rank's "
        "duration) and the nccl-tests bus factors. Points are medians, bars p10 to p90."
        if source == "transfer"
        else "No transfer times are known (no GPU times, or no timestamps), so these are the "
        "records' own bus bandwidths, from execution times that include waiting for peers."
    )
    fig = figure(figures.bandwidth_figure(rows), "fig-bandwidth", "Bus bandwidth", caption)
    table = [_bandwidth_row(r) for r in rows[:BANDWIDTH_ROWS]]
    return {
        "bandwidth": fig,
        "bandwidth_note": None,
        "bandwidth_rows": table,
        "bandwidth_more": max(0, len(rows) - BANDWIDTH_ROWS),
    }


def _bandwidth_row(r: dict[str, Any]) -> dict[str, str]:
    return {
        "func": r["func"],
        "size": figures.size_label(r["size_log2"]) + "+",
        "algo": f"{r['algo']}/{r['proto']}",
        "scope": "inter" if r["inter_node"] else "intra",
        "ops": f"{r['ops']:,}",
        "p10": f"{r['p10']:,.3g}",
        "p50": f"{r['p50']:,.3g}",
        "p90": f"{r['p90']:,.3g}",
    }


def clock_section(clock: dict[str, Any]) -> dict[str, Any]:
    hosts = clock["hosts"]
    notes = list(clock.get("notes") or [])
    if len(hosts) <= 1:
        return {
            "clock": None,
            "clock_rows": [],
            "clock_notes": notes,
            "clock_note": "One host: every rank shares its clock, so there is nothing to align.",
        }
    rows = [_clock_row(h) for h in hosts]
    if all(h["bound_ns"] is None for h in hosts if h["method"] != "reference"):
        return {
            "clock": None,
            "clock_rows": rows,
            "clock_notes": notes,
            "clock_note": "No host could be aligned with the reference host, so there "
            "are no offsets to draw.",
        }
    caption = (
        f"Offset of each host's clock from {clock['reference']} (grey) at the middle "
        "of the job, estimated in-band from the collectives; the true offset lies "
        "within the error bar. Orange: not aligned."
    )
    fig = figure(figures.clock_figure(hosts), "fig-clock-offsets", "Host clock offsets", caption)
    return {
        "clock": fig,
        "clock_rows": rows,
        "clock_notes": notes,
        "clock_note": None,
    }


def _clock_row(h: dict[str, Any]) -> dict[str, str]:
    bound = h["bound_ns"]
    return {
        "host": h["host"],
        "method": h["method"].replace("_", "-"),
        "offset": f"{h['offset_ns'] / 1e3:+,.1f}",
        "bound": "unknown" if bound is None else f"±{bound / 1e3:,.1f}",
        "drift": f"{h['drift_ppm']:+.3f}",
        "pairs": f"{h['pairs']:,}",
        "constraints": f"{h['constraints']:,}",
    }


def findings_section(summary: dict[str, Any]) -> dict[str, Any]:
    problems = summary.get("problems") or []
    return {
        "findings": [_finding_row(f) for f in summary.get("findings") or []],
        "detect_config": ", ".join(
            f"{k}={v}" for k, v in (summary.get("detect_config") or {}).items()
        ),
        "problems": [_problem_row(p) for p in problems[:PROBLEM_ROWS]],
        "problems_more": max(0, len(problems) - PROBLEM_ROWS),
        "skipped": [
            str(s.get("path", s)) + (f": {s['reason']}" if "reason" in s else "")
            for s in summary.get("skipped_files") or []
        ],
    }


def _finding_row(f: dict[str, Any]) -> dict[str, str]:
    since = f.get("since") or {}
    comm = f.get("comm") or {}
    return {
        "kind": str(f.get("kind")),
        "rank": "" if f.get("rank") is None else str(f["rank"]),
        "host": f.get("host") or "",
        "comm": comm.get("name") or comm.get("id") or "",
        "since": "" if since.get("seq") is None else f"op #{since['seq']}",
        "cause": f.get("cause") or "",
        "cost": "" if f.get("cost_s") is None else f"{f['cost_s']:,.3g} s",
        "confidence": f"{f.get('confidence') or 0:.0%}",
        "confirmed": _confirmed(f.get("evidence") or {}),
        "evidence": json.dumps(f.get("evidence") or {}, default=str)[:300],
    }


def _confirmed(evidence: dict[str, Any]) -> str:
    """Where and by which rule a straggler was confirmed (detect.straggler.confirmed_by)."""
    at = evidence.get("detected_at") or {}
    if at.get("seq") is None:
        return ""
    where = f"{at.get('func') or 'op'} #{at['seq']}"
    by = at.get("by") or {}
    for key, what in (("late_steps", "late steps"), ("late_ops", "late ops in a row"),
                      ("slow_ops", "slow transfers in a row")):  # fmt: skip
        if key in by:
            return f"{where}, after {by[key]} {what}"
    return f"{where}, by CUSUM" if "cusum_threshold" in by else where


def _problem_row(p: dict[str, Any]) -> dict[str, str]:
    where = p["file"] if p.get("line") is None else f"{p['file']}:{p['line']}"
    more = f" (and {p['repeats']:,} more like it)" if p.get("repeats") else ""
    return {"where": where, "kind": p.get("kind") or "", "message": p["message"] + more}
