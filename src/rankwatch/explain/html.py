"""Self-contained HTML reports of a trace analysis (`write_html(summary, path)`) and of a
diff (`write_diff_html(diff, path)`): plotly.js inlined once, every figure a div with
its own data, nothing loaded from elsewhere, so the file opens offline.

Both work from the plain-data summaries (report.summary, diff.compare), the same
data --json prints, so the page and the text cannot disagree.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

import rankwatch
from rankwatch.explain.ledger import BUCKETS
from rankwatch.explain.report import BUCKET_TITLES, render_text

TEMPLATES = Path(__file__).parent / "templates"
COLORS = {
    "compute": "#4c78a8",
    "overlapped_comm": "#72b7b2",
    "exposed_transfer": "#f58518",
    "exposed_wait": "#e45756",
    "exposed_comm_unsplit": "#ff9da6",
    "memcpy": "#9d755d",
    "input_wait": "#b279a2",
    "host_launch_gap": "#eeca3b",
    "idle": "#bab0ac",
    "unclassified": "#555555",
}
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _div(fig: go.Figure, div_id: str) -> Markup:
    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 40, "b": 50})
    return Markup(
        fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config=PLOT_CONFIG,
            default_width="100%",
            default_height=f"{fig.layout.height or 420}px",
        )
    )


def _ms(ns: float | None) -> float | str:
    return "n/a" if ns is None else round(ns / 1e6, 3)


def _step_figure(s: dict[str, Any]) -> Markup:
    rows = s["ledger"]["rows"]
    fig = go.Figure()
    for rank in sorted({r["rank"] for r in rows}):
        mine = [r for r in rows if r["rank"] == rank]
        fig.add_trace(
            go.Scatter(
                x=[r["step"] for r in mine],
                y=[r["wall_ns"] / 1e6 for r in mine],
                mode="lines+markers",
                name=f"rank {rank}",
            )
        )
    fig.update_layout(
        title="Step wall time per rank", xaxis_title="step", yaxis_title="ms", height=380
    )
    return _div(fig, "fig-steps")


def _ledger_figure(
    means: dict[str, dict[str, float]], div_id: str, title: str, xlabel: str
) -> Markup:
    fig = go.Figure()
    xs = list(means)
    for b in BUCKETS:
        ys = [means[x].get(b, 0.0) / 1e6 for x in xs]
        if any(ys):
            fig.add_trace(go.Bar(x=xs, y=ys, name=BUCKET_TITLES[b], marker_color=COLORS[b]))
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title=xlabel,
        yaxis_title="ms per step",
        height=420,
        xaxis={"type": "category"},
    )
    return _div(fig, div_id)


def _per_step_means(s: dict[str, Any]) -> dict[str, dict[str, float]]:
    acc: dict[int, list[dict[str, Any]]] = {}
    for r in s["ledger"]["rows"]:
        acc.setdefault(r["step"], []).append(r)
    return {
        str(n): {b: sum(r[f"{b}_ns"] for r in rs) / len(rs) for b in BUCKETS}
        for n, rs in sorted(acc.items())
    }


def _ledger_section(s: dict[str, Any]) -> dict[str, Any]:
    led = s["ledger"]
    per_rank = {f"rank {r}": m for r, m in led["per_rank_mean_ns"].items()}
    used = [b for b in BUCKETS if led["job_mean_ns"].get(b, 0) > 0]
    rows = [
        [name, _ms(m["wall"]), *(_ms(m[b]) for b in used)]
        for name, m in [*per_rank.items(), ("all ranks", led["job_mean_ns"])]
    ]
    return {
        "id": "ledger",
        "title": "Ledger",
        "paras": [
            "Every rank's measured step time split into buckets that add up to it exactly "
            f"({'checked: they do' if led['reconciled'] else 'CHECK FAILED'}). Useful overlap is "
            "communication transferring while compute runs; communication that only waits "
            f"under compute ({led['visual_overlap_mean_ns'] / 1e6:.2f} ms per step) is visual "
            "overlap and counted as compute.",
        ],
        "figures": [
            _ledger_figure(per_rank, "fig-ledger-ranks", "Mean ledger per rank", "rank"),
            _ledger_figure(
                _per_step_means(s), "fig-ledger-steps", "Ledger per step (mean over ranks)", "step"
            ),
        ],
        "tables": [
            {
                "caption": "ms per step, mean over steps",
                "head": ["", "step", *(BUCKET_TITLES[b] for b in used)],
                "rows": rows,
            }
        ],
    }


def _finding_rows(s: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for f in s["findings"]:
        root = f["root"] or {}
        rows.append(
            [
                f["kind"] if f["step"] is None else f"step {f['step']}",
                _ms(f["step_time_ns"]),
                "-" if f["culprit"] is None else f"rank {f['culprit']}",
                f["collective"] or "-",
                _ms(f["arrival_late_ns"]),
                root.get("summary", root.get("name", f["note"]))[:160],
                root.get("host_op") or "",
                root.get("annotation") or "",
                _ms(root.get("extra_ns")),
                ", ".join(f"{r}: {v / 1e6:.2f}" for r, v in f["waits_caused_ns"].items()),
                _ms(f["unexplained_ns"]),
            ]
        )
    return rows


def _sections(s: dict[str, Any]) -> list[dict[str, Any]]:
    findings = {
        "id": "divergence",
        "title": "First divergence",
        "paras": [
            "For each slow step: the rank whose late arrival determined it, and the first "
            "op on that rank that departs from its peers and its own history."
        ]
        if s["findings"]
        else ["No slow step and no persistent straggler."],
        "tables": [
            {
                "head": [
                    "step",
                    "step time ms",
                    "culprit",
                    "collective",
                    "late ms",
                    "first divergent op",
                    "host op",
                    "annotation",
                    "extra ms",
                    "waits caused (rank: ms)",
                    "unexplained ms",
                ],
                "rows": _finding_rows(s),
            }
        ]
        if s["findings"]
        else [],
    }
    clocks = {
        "id": "clocks",
        "title": "Clocks",
        "tables": [
            {
                "head": ["rank", "clock domain", "offset ms", "bound ms", "method"],
                "rows": [
                    [r["rank"], r["domain"], _ms(r["offset_ns"]), _ms(r["bound_ns"]), r["method"]]
                    for r in s["clock"]["ranks"]
                ],
            }
        ],
        "paras": s["clock"]["notes"],
    }
    return [
        {"id": "summary", "title": "Summary", "pre": render_text(s)},
        {"id": "steps", "title": "Steps", "figures": [_step_figure(s)]},
        _ledger_section(s),
        findings,
        clocks,
    ]


def _render(title: str, sections: list[dict[str, Any]]) -> str:
    from plotly.offline import get_plotlyjs

    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    for sec in sections:
        for key in ("headline", "paras", "figures", "tables"):
            sec.setdefault(key, [])
        sec.setdefault("pre", "")
    return env.get_template("trace.html.j2").render(
        title=title,
        sections=sections,
        version=rankwatch.__version__,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        figure_count=sum(len(sec["figures"]) for sec in sections),
        plotly_js=Markup(get_plotlyjs()),
    )


def _write(page: str, path: str | os.PathLike[str]) -> Path:
    from rankwatch.export.html import write_page

    return write_page(page, path)


def write_html(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """The trace analysis report (summary from report.summary)."""
    ranks = len(summary["input"]["ranks"])
    return _write(_render(f"rankwatch trace: {ranks} ranks", _sections(summary)), path)


def write_diff_html(diff: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """The regression diff report (diff from diff.compare)."""
    from rankwatch.explain.diff import render_diff

    buckets = diff["buckets"]
    fig = go.Figure(
        go.Bar(
            x=[BUCKET_TITLES[b] for b in BUCKETS],
            y=[buckets[b]["delta_ns"] / 1e6 for b in BUCKETS],
            marker_color=[COLORS[b] for b in BUCKETS],
        )
    )
    fig.update_layout(
        title="Change of the mean step by ledger bucket", yaxis_title="ms", height=380
    )
    ops = {
        "head": ["op", "before ms", "after ms", "change ms"],
        "rows": [
            [r["op"][:120], _ms(r["before_ns"]), _ms(r["after_ns"]), _ms(r["delta_ns"])]
            for r in diff["by_op"]
        ],
    }
    sections = [
        {"id": "summary", "title": "Summary", "pre": render_diff(diff)},
        {"id": "buckets", "title": "By bucket", "figures": [_div(fig, "fig-diff-buckets")]},
        {"id": "ops", "title": "By op", "tables": [ops]},
    ]
    return _write(_render("rankwatch trace diff", sections), path)
