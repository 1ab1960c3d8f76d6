"""`write_html(run, summary, path)`: one self-contained HTML report of an analysed run.

The file opens offline: plotly.js is inlined once, every figure is a div plus a
Plotly.newPlot call carrying its own downsampled data, and nothing is loaded
from anywhere else. Sections, top to bottom: a plain-language summary; per
collective function, the three-row timeline (enqueue, GPU start, GPU end delay of
every rank behind the earliest) on the world communicator, then on the other
communicators together; a rank x time lateness heatmap; bus bandwidth; host clock
offsets; findings; and the problems met while reading the records.

`run` must have been through `rankwatch.align.align`; `summary` is what
`rankwatch.align.summary.summarize` returned. Neither is changed.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

import rankwatch
from rankwatch.export import html_data as data
from rankwatch.export import html_sections as sections
from rankwatch.export import html_text as text
from rankwatch.export.html_onset import Onset, rank_onset
from rankwatch.model import Run

TEMPLATES = Path(__file__).parent / "templates"
MARKED_LATE_RANKS = 3  # the most-late ranks, always drawn in the timelines


def write_html(run: Run, summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write the report to `path` (through a temporary file, then renamed); returns it."""
    return write_page(render(context(run, summary)), path)


def write_page(page: str, path: str | os.PathLike[str]) -> Path:
    """Write an HTML page atomically: a reader never sees half a report."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def render(ctx: dict[str, Any]) -> str:
    from plotly.offline import get_plotlyjs

    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("report.html.j2").render(**ctx, plotly_js=Markup(get_plotlyjs()))


def context(run: Run, summary: dict[str, Any]) -> dict[str, Any]:
    """Everything the template shows, from the run's tables and the summary."""
    t0 = data.job_start_ns(run)
    world = summary["job"].get("world_comm") or {}
    gaps = data.record_gaps(run)
    ctx: dict[str, Any] = {
        "title": "rankwatch report: job " + (", ".join(summary["job"]["job_ids"]) or "unknown"),
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "version": rankwatch.__version__,
        "headline": text.headline(summary, _onset(run, summary, t0), t0),
        "facts": text.facts(summary, t0),
        "lacks": text.lacks(gaps, summary),
    }
    late = [r["world_rank"] for r in (summary.get("late_ranks") or [])[:MARKED_LATE_RANKS]]
    delays = data.op_delays(run, world.get("key"), t0)
    ctx.update(sections.timeline_section(run, world, t0, gaps, late, delays))
    ctx.update(sections.heatmap_section(t0, gaps, delays))
    ctx.update(sections.bandwidth_section(run))
    ctx.update(sections.clock_section(summary["clock"]))
    ctx.update(sections.findings_section(summary))
    others = sum(ctx[k] is not None for k in ("heatmap", "bandwidth", "clock"))
    ctx["figure_count"] = len(ctx["timelines"]) + others
    return ctx


def _onset(run: Run, summary: dict[str, Any], t0: int | None) -> Onset | None:
    late = summary.get("late_ranks") or []
    if not late or t0 is None:
        return None
    bound = 2 * (summary["clock"].get("max_bound_ns") or 0)
    return rank_onset(run, late[0]["world_rank"], text.measure_of(late[0]), t0, bound)
