"""`rankwatch analyze`: read record files, align ranks and clocks, summarise."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rankwatch.cli._options import detect_option
from rankwatch.errors import RecordError

if TYPE_CHECKING:
    from rankwatch.detect.base import Config

SHOWN_COMMS = 8
SHOWN_PROBLEMS = 20


def _us(ns: float | None, signed: bool = False) -> str:
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "unknown"
    return f"{ns / 1e3:+,.1f} us" if signed else f"{ns / 1e3:,.1f} us"


def _ms(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.1f} ms"


def _processes(job: dict[str, Any]) -> str:
    n = job.get("processes", job["ranks"])
    return f"{n} process" + ("" if n == 1 else "es")


def _job_lines(s: dict[str, Any]) -> list[str]:
    job = s["job"]
    ids = ", ".join(job["job_ids"]) or "unknown"
    formats = ", ".join(f"{n:,} {f}" for f, n in job["formats"].items()) or "none"
    span = "" if job["time_span_s"] is None else f" over {job['time_span_s']:,.1f} s"
    state = sum(job["state_records"].values())
    return [
        f"Job {ids}: {job['op_records']:,} op records ({formats}){span}, {state:,} state "
        f"records, from {job['files']} file(s).",
        f"Ranks: {job['ranks']} in {_processes(job)} on {job['hosts']} host(s).",
    ]


def _comm_lines(s: dict[str, Any]) -> list[str]:
    comms = s["communicators"]
    lines = [f"Communicators: {len(comms)}" + (" (world: the largest)" if comms else "")]
    for c in comms[:SHOWN_COMMS]:
        funcs = ", ".join(f"{f} {n:,}" for f, n in c["ops_per_func"].items()) or "no ops"
        bw = c["median_busbw_gbs"]
        bw_text = "" if bw is None else f", median bus bandwidth {bw:,.3g} GB/s"
        lines.append(
            f"  {c['name'] or 'unnamed'} {c['id']}: {c['n_ranks']} ranks on "
            f"{c['nnodes']} node(s); {funcs}{bw_text}"
        )
    if len(comms) > SHOWN_COMMS:
        lines.append(f"  ... and {len(comms) - SHOWN_COMMS} more")
    funcs = ", ".join(f"{f} {n:,}" for f, n in s["ops_per_func"].items())
    return lines + [f"Ops per function: {funcs or 'none'}"]


def _clock_lines(s: dict[str, Any]) -> list[str]:
    clock = s["clock"]
    hosts = clock["hosts"]
    if not hosts:
        return ["Clocks: no op records, nothing to align."]
    if len(hosts) == 1:
        return ["Clocks: one host, no alignment needed."]
    lines = [
        f"Clocks: offsets against {clock['reference']}, estimated from the collectives "
        "(the true offset lies within the bound):"
    ]
    for h in hosts:
        if h["method"] == "reference":
            continue
        if h["bound_ns"] is None:
            lines.append(f"  {h['host']}: not aligned ({h['method']})")
            continue
        lines.append(
            f"  {h['host']}: {_us(h['offset_ns'], True)} +- {_us(h['bound_ns'])}, "
            f"drift {h['drift_ppm']:+.3f} ppm"
        )
    return lines + [f"  note: {n}" for n in clock["notes"]]


def _lateness(times: int | None, caused: float | None, mean: float | None, what: str) -> str:
    if not times:
        return ""
    return f"{what} {times} time(s), {_ms(caused)} caused ({_us(mean)} each)"


def _late_lines(s: dict[str, Any]) -> list[str]:
    late = s["late_ranks"]
    if not late and s["job"].get("time_span_s") is None and s["job"].get("op_records"):
        return [
            "Late ranks: cannot be told (the records carry no per-op timestamps, e.g. "
            "Inspector logs without event traces: durations and bandwidth only)."
        ]
    if not late:
        return ["Late ranks: none (no collective was seen by more than one rank)."]
    lines = [
        "Most-late ranks (lag caused: how much later than the next-latest rank, summed "
        "over the collectives where the rank was last):"
    ]
    for r in late:
        parts = [
            _lateness(r["times_last_arrival"], r["arrival_lag_caused_ns"],
                      r["mean_last_arrival_lag_ns"], "last to call"),
            _lateness(r["times_last_gpu_start"], r["gpu_lag_caused_ns"],
                      r["mean_last_gpu_lag_ns"], "last to start on the GPU"),
        ]  # fmt: skip
        text = "; ".join(p for p in parts if p)
        gpu = f", GPU {r['device']}" if r.get("device") is not None else ""
        lines.append(f"  rank {r['world_rank']} ({r['host']}{gpu}): {text}")
    bound = s["clock"]["max_bound_ns"]
    if bound:
        lines.append(
            f"  Comparisons across hosts are uncertain by up to {_us(2 * bound)}; "
            "lags smaller than that are not evidence of lateness."
        )
    return lines


def _finding_line(f: dict[str, Any]) -> str:
    gpu = f", GPU {f['device']}" if f.get("device") is not None else ""
    who = f"rank {f['rank']} ({f['host']}{gpu})" if f.get("rank") is not None else "communicator"
    comm = (f.get("comm") or {}).get("name") or (f.get("comm") or {}).get("id") or "?"
    since = f.get("since") or {}
    func = ((f.get("evidence") or {}).get("onset") or {}).get("func", "")
    at = f" on {comm}"
    if since.get("seq") is not None:
        at = f" since {func} #{since['seq']}{at}"
    cause = f", cause {f['cause']}" if f.get("cause") else ""
    cost = f", cost {f['cost_s']:.3f} s" if f.get("cost_s") is not None else ""
    return f"  {f['kind']}: {who}{at}{cause}{cost} (confidence {f['confidence']:.2f})"


def _finding_lines(s: dict[str, Any]) -> list[str]:
    findings = s.get("findings") or []
    if not findings:
        return ["Findings: none (no straggler, hang or desync)."]
    return [f"Findings ({len(findings)}):", *(_finding_line(f) for f in findings)]


def _problem_lines(s: dict[str, Any]) -> list[str]:
    problems = s["problems"]
    if not problems:
        return ["Problems while reading: none."]
    total = sum(1 + p["repeats"] for p in problems)
    lines = [f"Problems while reading: {total} (good lines were still loaded):"]
    for p in problems[:SHOWN_PROBLEMS]:
        where = p["file"] if p["line"] is None else f"{p['file']}:{p['line']}"
        more = f" (and {p['repeats']} more like it)" if p["repeats"] else ""
        lines.append(f"  {where}: {p['message']}{more}")
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(f"  ... and {len(problems) - SHOWN_PROBLEMS} more (see --json)")
    return lines


def render_text(summary: dict[str, Any]) -> str:
    sections = [_job_lines, _comm_lines, _clock_lines, _late_lines, _finding_lines,
                _problem_lines]
    return "\n".join(line for section in sections for line in section(summary)) + "\n"


def analyze(
    dirs: tuple[Path, ...],
    store: Path | None,
    quiet: bool,
    html: Path | None = None,
    perfetto: Path | None = None,
    detect_config: Config | None = None,
) -> dict[str, Any]:
    """Ingest, align and summarise (and write the HTML report to `html` if given);
    raises RecordError when nothing usable was found. `detect_config`: the
    detectors' thresholds (the defaults when None)."""
    from rankwatch.align import align
    from rankwatch.align.summary import summarize
    from rankwatch.store import ingest
    from rankwatch.store.progress import reporter_for

    reporter = reporter_for(not quiet)
    loaded = ingest(list(dirs), store_path=store, progress=reporter)
    if not loaded.usable:
        found = f"{len(loaded.files)} record file(s)" if loaded.files else "no record files"
        details = "; ".join(str(p) for p in loaded.problems[:3])
        raise RecordError(
            f"nothing usable to analyse: {found}" + (f" ({details})" if details else ""),
            file=", ".join(str(d) for d in dirs),
        )
    run = loaded.run()
    with reporter.step("aligning ranks, clocks and collectives"):
        clock = align(run)
    summary = summarize(run, clock)
    with reporter.step("detecting stragglers, hangs and desyncs"):
        from rankwatch.detect import detect

        summary["findings"] = [f.to_dict() for f in detect(run, clock, config=detect_config)]
        # the thresholds that differ from the defaults: what these findings ran with
        summary["detect_config"] = detect_config.changed() if detect_config else {}
    summary["timings"] = dict(loaded.timings)
    if html is not None:
        from rankwatch.export.html import write_html

        with reporter.step("writing the HTML report"):
            write_html(run, summary, html)
    if perfetto is not None:
        from rankwatch.export.perfetto import write_perfetto

        with reporter.step("writing the Perfetto trace"):
            summary["perfetto"] = write_perfetto(run, perfetto).__dict__
    return summary


@click.command("analyze")
@click.argument(
    "dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path), metavar="DIR..."
)
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    default=None,
    help="Keep the loaded records: PATH.duckdb (a DuckDB file) or a directory "
    "(Parquet, zstd) for later SQL.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@click.option(
    "--html",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a self-contained HTML report (opens offline) to PATH.",
)
@click.option(
    "--perfetto",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a timeline of every rank's ops (Perfetto protobuf, open it in "
    "ui.perfetto.dev) to PATH, e.g. trace.pftrace.",
)
@detect_option
def command(
    dirs: tuple[Path, ...],
    store: Path | None,
    as_json: bool,
    quiet: bool,
    html: Path | None,
    perfetto: Path | None,
    detect_config: Config | None,
) -> None:
    """Analyse the record files under DIR... (searched recursively).

    Reads rankwatch and NCCL/RCCL Inspector records, maps every process to its
    rank, aligns host clocks in-band, matches collectives across ranks and
    reports ranks, communicators, clock offsets with error bounds, the most-late
    ranks and any problems found while reading. Exits non-zero only when
    nothing usable was found.
    """
    summary = analyze(dirs, store, quiet or as_json, html, perfetto, detect_config)
    if as_json:
        click.echo(json.dumps(summary, default=str))
    else:
        click.echo(render_text(summary), nl=False)
    if html is not None and not quiet:
        click.echo(f"HTML report: {html}", err=as_json)
    if perfetto is not None and not quiet:
        trace = summary["perfetto"]
        click.echo(f"Perfetto trace: {perfetto} (open in ui.perfetto.dev)", err=as_json)
        for note in trace["notes"]:
            click.echo(f"  note: {note}", err=as_json)
