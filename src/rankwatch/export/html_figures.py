"""Plotly figures of the HTML report, built from html_data's compact arrays.

Figures use SVG traces only (no WebGL), so they draw in any browser, headless
ones without a GPU included; the data are already downsampled to a few hundred
points per trace.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from rankwatch.export.html_data import LatenessGrid, Timeline

ALL_RANKS_UP_TO = 16  # more ranks: the TOP_RANKS latest as traces, the rest as a band
TOP_RANKS = 8
ROW_TITLES = ("Enqueue (NCCL call)", "GPU start", "GPU end")
PALETTE = qualitative.Dark24
BAND = "rgba(120, 120, 120, 0.28)"
TEMPLATE = "plotly_white"
TRACE_TYPES = ("scatter", "heatmap", "bar")  # what the figures draw
DELAY_AXIS = "µs after earliest rank"


@functools.lru_cache(maxsize=1)
def template() -> go.layout.Template:
    """TEMPLATE with the defaults of the trace types the figures draw only: assigned
    to a figure it is validated and copied, the whole of it (forty trace types) at
    40 ms a figure, this one at 13 ms; it also halves each figure's JSON."""
    import plotly.io as pio

    full = pio.templates[TEMPLATE]
    return go.layout.Template(
        layout=full.layout, data={kind: getattr(full.data, kind) for kind in TRACE_TYPES}
    )


def _quiet_nan(fn: Any, a: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(a, axis=axis)


def pick_ranks(t: Timeline, late: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Indices of ranks drawn as traces and of ranks shown as a band: all ranks when
    few; else the `late` ranks (the job's most late) then the latest by mean delay
    here, TOP_RANKS in all."""
    order = np.arange(len(t.ranks))
    if len(order) <= ALL_RANKS_UP_TO:
        return order, order[:0]
    score = np.nan_to_num(_quiet_nan(np.nanmax, _quiet_nan(np.nanmean, t.delay_us, 2), 0), nan=-1)
    first = [int(i) for r in late for i in np.flatnonzero(t.ranks == r)]
    latest = [int(i) for i in np.argsort(-score, kind="stable") if int(i) not in first]
    shown = np.array((first + latest)[:TOP_RANKS], dtype=int)
    return shown, np.setdiff1d(order, shown)


def timeline_figure(t: Timeline, late: list[int]) -> go.Figure:
    """Three rows (enqueue, GPU start, GPU end): each rank's delay behind the earliest."""
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07, subplot_titles=ROW_TITLES
    )
    shown, rest = pick_ranks(t, late)
    if len(rest):
        _add_band(fig, t, rest)
    for n, i in enumerate(shown):
        _add_rank(fig, t, i, PALETTE[n % len(PALETTE)])
    for p in range(3):
        top = delay_axis_top(t.delay_us[p])
        fig.update_yaxes(
            title_text=DELAY_AXIS,
            rangemode="tozero",
            row=p + 1,
            col=1,
            range=None if top is None else [0, top],
        )
    fig.update_xaxes(title_text="job time (s)", row=3, col=1)
    fig.update_layout(
        template=template(),
        height=720,
        margin={"l": 70, "r": 20, "t": 40, "b": 50},
        legend={"title": {"text": "rank"}, "itemsizing": "constant"},
        hovermode="closest",
    )
    return fig


def delay_axis_top(delay: np.ndarray) -> float | None:
    """Top of a delay axis that rare spikes do not squash: 1.2 x the largest per-rank
    99th percentile, when the largest delay is above 1.5 x that; else None (auto)."""
    finite = ~np.isnan(delay).all(axis=1)
    if not finite.any():
        return None
    p99 = float(np.max(row_percentiles(delay[finite], 99.0)))
    largest = float(np.nanmax(delay[finite]))
    return 1.2 * p99 if p99 > 0 and largest > 1.5 * p99 else None


def row_percentiles(a: np.ndarray, q: float) -> np.ndarray:
    """np.nanpercentile(a, q, axis=1) (its linear method, the same values) for rows
    with a value each, computed for all rows at once: NumPy takes rows with NaN one
    at a time (a thousand ranks' rows: 0.8 s of the report)."""
    ordered = np.sort(a, axis=1)  # NaN last
    count = np.sum(~np.isnan(a), axis=1)
    virtual = (count - 1) * (q / 100.0)
    below = np.floor(virtual)
    gamma = virtual - below
    lo = below.astype(np.int64)
    hi = np.minimum(lo + 1, count - 1)
    x = np.take_along_axis(ordered, lo[:, None], axis=1)[:, 0]
    y = np.take_along_axis(ordered, hi[:, None], axis=1)[:, 0]
    diff = y - x
    # NumPy's _lerp: from the nearer end, so that the ends come out exact
    return np.where(gamma >= 0.5, y - diff * (1 - gamma), x + diff * gamma)


def _add_rank(fig: go.Figure, t: Timeline, i: int, color: str) -> None:
    rank = int(t.ranks[i])
    for p in range(3):
        y = t.delay_us[p, i]
        keep = ~np.isnan(y)
        fig.add_trace(
            go.Scatter(
                x=t.time_s[keep].astype(np.float32),
                y=y[keep],
                name=str(rank),
                legendgroup=str(rank),
                showlegend=p == 0,
                mode="markers",
                marker={"size": 4, "color": color, "opacity": 0.85},
                hovertemplate=f"rank {rank}<br>%{{x:.3f}} s<br>%{{y:,.1f}} µs<extra></extra>",
            ),
            row=p + 1,
            col=1,
        )


def _add_band(fig: go.Figure, t: Timeline, rest: np.ndarray) -> None:
    for p in range(3):
        lo = _quiet_nan(np.nanmin, t.delay_us[p][rest], 0)
        hi = _quiet_nan(np.nanmax, t.delay_us[p][rest], 0)
        keep = ~np.isnan(lo)
        x = t.time_s[keep]
        fig.add_trace(
            go.Scatter(
                x=np.concatenate([x, x[::-1]]).astype(np.float32),
                y=np.concatenate([hi[keep], lo[keep][::-1]]).astype(np.float32),
                fill="toself",
                fillcolor=BAND,
                line={"width": 0},
                hoverinfo="skip",
                name=f"other {len(rest)} ranks (min to max)",
                legendgroup="rest",
                showlegend=p == 0,
            ),
            row=p + 1,
            col=1,
        )


def heatmap_figure(g: LatenessGrid) -> go.Figure:
    """Rank x time: mean delay behind the earliest rank, clipped at the 99th percentile."""
    finite = g.delay_us[~np.isnan(g.delay_us)]
    top = float(np.percentile(finite, 99)) if finite.size else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=g.delay_us,
            x=g.time_s.astype(np.float32),
            y=g.ranks.astype(np.int32),
            colorscale="YlOrRd",
            zmin=0,
            zmax=max(top, 1e-3),
            colorbar={"title": {"text": "µs"}},
            hovertemplate="rank %{y}<br>%{x:.2f} s<br>mean delay %{z:,.1f} µs<extra></extra>",
        )
    )
    height = int(min(900, max(320, 14 * len(g.ranks) + 140)))
    fig.update_layout(
        template=template(),
        height=height,
        margin={"l": 70, "r": 20, "t": 20, "b": 50},
        xaxis_title="job time (s)",
        yaxis_title="rank",
    )
    fig.update_yaxes(autorange="reversed", type="category" if len(g.ranks) <= 64 else "linear")
    return fig


def size_label(log2: int) -> str:
    """2**log2 bytes as a short label: 4 B, 8 KiB, 16 MiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if log2 >= shift:
            return f"{2 ** (log2 - shift)} {unit}"
    return f"{2**log2} B"


def bandwidth_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Median bus bandwidth per message-size bucket; error bars span p10..p90."""
    fig = go.Figure()
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["func"], r["algo"], r["proto"], r["inter_node"])
        groups.setdefault(key, []).append(r)
    for n, ((func, algo, proto, inter), rs) in enumerate(groups.items()):
        scope = "inter-node" if inter else "intra-node"
        fig.add_trace(_bandwidth_trace(rs, f"{func} {algo}/{proto} {scope}", PALETTE[n % 24]))
    sizes = sorted({r["size_log2"] for r in rows})
    fig.update_xaxes(
        type="log",
        title_text="message size (bucket lower bound)",
        tickvals=[2**s for s in sizes],
        ticktext=[size_label(s) for s in sizes],
    )
    fig.update_yaxes(type="log", title_text="bus bandwidth (GB/s)")
    fig.update_layout(
        template=template(),
        height=440,
        margin={"l": 70, "r": 20, "t": 20, "b": 50},
        showlegend=True,
        legend={"title": {"text": "collective, algo/proto, nodes"}},
    )
    return fig


def _bandwidth_trace(rs: list[dict[str, Any]], name: str, color: str) -> go.Scatter:
    x = np.array([2 ** r["size_log2"] for r in rs], dtype=float)
    mid = np.array([r["p50"] for r in rs], dtype=float)
    up = np.array([r["p90"] for r in rs], dtype=float) - mid
    down = mid - np.array([r["p10"] for r in rs], dtype=float)
    ops = [r["ops"] for r in rs]
    return go.Scatter(
        x=x,
        y=mid,
        name=name,
        mode="lines+markers",
        customdata=ops,
        marker={"color": color, "size": 7},
        line={"color": color, "width": 1.5},
        error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down},
        hovertemplate=f"{name}<br>%{{y:,.3g}} GB/s (median of %{{customdata:,}} ops)"
        "<extra></extra>",
    )


def clock_figure(hosts: list[dict[str, Any]]) -> go.Figure:
    """Each host's clock offset from the reference host, with its error bound."""
    names = [h["host"] for h in hosts]
    offset = [h["offset_ns"] / 1e3 for h in hosts]
    bound = [0.0 if h["bound_ns"] is None else h["bound_ns"] / 1e3 for h in hosts]
    color = [
        "#9e9e9e"
        if h["method"] == "reference"
        else "#e67e22"
        if h["bound_ns"] is None
        else "#2e86c1"
        for h in hosts
    ]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=offset,
            marker_color=color,
            error_y={"type": "data", "array": bound, "visible": True, "color": "#333"},
            hovertemplate="%{x}<br>offset %{y:,.1f} µs ± %{error_y.array:,.1f} µs<extra></extra>",
        )
    )
    fig.update_layout(
        template=template(),
        height=360,
        margin={"l": 70, "r": 20, "t": 20, "b": 80},
        xaxis_title="host",
        yaxis_title="offset from reference (µs)",
    )
    return fig
