"""`rankwatch trace`: analyse per-rank profiler traces (PyTorch Profiler / Kineto JSON,
Nsight Systems SQLite): step ledger, first unexplained divergence, efficiency;
`rankwatch trace diff BEFORE AFTER`: where a step-time change went."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rankwatch.errors import ConfigError
from rankwatch.explain.peaks import DTYPES, PEAKS

if TYPE_CHECKING:  # the analysis is imported only when a command runs
    from rankwatch.explain.analysis import TraceOptions

DEFAULT_COMMAND = "analyze"


class _TraceGroup(click.Group):
    """`rankwatch trace FILES...` runs the analysis; `rankwatch trace diff A B` compares.
    Arguments that are not a subcommand name go to the hidden default command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        help_only = bool(args) and all(a in ctx.help_option_names for a in args)
        if args and not help_only and args[0] not in self.commands:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] DIR_OR_FILES...")
        formatter.write_usage(ctx.command_path, "diff [OPTIONS] BEFORE AFTER", prefix="       ")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The options belong to the hidden default command; show them here, where
        # users look for them.
        default = self.commands[DEFAULT_COMMAND]
        records = [
            p.get_help_record(ctx) for p in default.get_params(ctx) if isinstance(p, click.Option)
        ]
        with formatter.section("Options"):
            formatter.write_dl([r for r in records if r])
        self.format_commands(ctx, formatter)


class _DefaultContext(click.Context):
    """The hidden default command speaks as `rankwatch trace` in usage and errors."""

    @property
    def command_path(self) -> str:
        return self.parent.command_path if self.parent else super().command_path


class _DefaultCommand(click.Command):
    context_class = _DefaultContext


def _analysis_options(func: Any) -> Any:
    options = (
        click.option(
            "--json", "as_json", is_flag=True, help="Print one JSON object instead of text."
        ),
        click.option(
            "--html",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Also write a self-contained HTML report (opens offline) to PATH.",
        ),
        click.option(
            "--model-flops",
            default=None,
            metavar="N|params=P,tokens=T",
            help="Model FLOPs per training step (all GPUs): a number, or params=...,"
            "tokens=...[,layers=,hidden=,seq=] for 6NT (+ attention).",
        ),
        click.option(
            "--hardware-flops",
            type=float,
            default=None,
            metavar="N",
            help="Hardware FLOPs per step incl. recomputation [default: the profiler's "
            "counts, when traced with_flops].",
        ),
        click.option(
            "--peak-flops",
            type=float,
            default=None,
            metavar="FLOP/S",
            help="Peak FLOP/s of one GPU [default: from the GPU's name].",
        ),
        click.option(
            "--gpu",
            default=None,
            metavar="NAME",
            help=f"GPU model for the peak table: {', '.join(PEAKS)}.",
        ),
        click.option(
            "--dtype",
            type=click.Choice(DTYPES),
            default="bf16",
            show_default=True,
            help="Precision of the peak rate.",
        ),
        click.option(
            "--world-size",
            type=click.IntRange(min=1),
            default=None,
            help="GPUs in the job [default: from the traces].",
        ),
        click.option(
            "--busbw-peak",
            type=float,
            default=None,
            metavar="GB/S",
            help="Reference bus bandwidth for collective efficiency.",
        ),
        click.option(
            "--busbw-baseline",
            type=click.Path(exists=True, dir_okay=False),
            default=None,
            help="Measured reference: nccl-tests output or JSON "
            '{"allreduce": [[bytes, GB/s], ...]}.',
        ),
        click.option(
            "--step-pattern",
            default=None,
            metavar="REGEX",
            help="Step marker names; group 1 is the step number.",
        ),
        click.option(
            "--input-pattern",
            default=None,
            metavar="REGEX",
            help="Host ranges that wait for input data.",
        ),
        click.option(
            "--jobs",
            "-j",
            type=click.IntRange(min=0),
            default=0,
            show_default=True,
            help="Files read in parallel (0: one per CPU).",
        ),
        click.option("--quiet", "-q", is_flag=True, help="No progress output."),
    )
    for option in reversed(options):
        func = option(func)
    return func


def _options(o: dict[str, Any]) -> TraceOptions:
    from rankwatch.explain.analysis import TraceOptions

    opts = TraceOptions(
        jobs=o["jobs"],
        model_flops=o["model_flops"],
        hardware_flops=o["hardware_flops"],
        peak_flops=o["peak_flops"],
        gpu=o["gpu"],
        dtype=o["dtype"],
        world_size=o["world_size"],
        busbw_peak_gbs=o["busbw_peak"],
        busbw_baseline=o["busbw_baseline"],
    )
    if o["step_pattern"]:
        opts.step_pattern = _regex(o["step_pattern"], "--step-pattern", groups=1)
    if o["input_pattern"]:
        opts.input_pattern = _regex(o["input_pattern"], "--input-pattern", groups=0)
    return opts


def _regex(text: str, name: str, groups: int) -> str:
    import re

    try:
        compiled = re.compile(text)
    except re.error as exc:
        raise ConfigError(f"not a regular expression: {exc}", field=name) from None
    if compiled.groups < groups:
        raise ConfigError("needs a group that captures the step number", field=name)
    return text


def _progress(quiet: bool) -> Callable[[str], None] | None:
    if quiet:
        return None
    return lambda stage: click.echo(f"rankwatch trace: {stage} ...", err=True)


def _run(paths: list[Path], o: dict[str, Any]) -> dict[str, Any]:
    from rankwatch.explain.analysis import analyze
    from rankwatch.explain.report import summary

    a = analyze(paths, _options(o), _progress(o["quiet"] or o["as_json"]))
    s = summary(a)
    if o["html"] is not None:
        from rankwatch.explain.html import write_html

        write_html(s, o["html"])
    return s


@click.group("trace", cls=_TraceGroup, invoke_without_command=False)
def command() -> None:
    """Analyse per-rank profiler traces: rankwatch trace DIR_OR_FILES... [options].

    Reads one trace per rank (PyTorch Profiler / Kineto JSON, plain or gzipped, or
    Nsight Systems SQLite exports), aligns steps and collectives across ranks,
    estimates clock offsets, splits every rank's step time into an exact ledger,
    finds the first unexplained divergence behind slow steps, and computes MFU and
    bus bandwidth efficiency. `rankwatch trace diff BEFORE AFTER` compares two runs.
    Unreadable files are reported and the other ranks are still analysed.
    """


@command.command(DEFAULT_COMMAND, cls=_DefaultCommand, hidden=True)
@click.argument(
    "paths",
    nargs=-1,
    required=True,
    metavar="DIR_OR_FILES...",
    type=click.Path(exists=True, path_type=Path),
)
@_analysis_options
def analyze_command(paths: tuple[Path, ...], **o: Any) -> None:
    """Analyse the traces in DIR_OR_FILES (directories are searched recursively)."""
    from rankwatch.explain.report import render_text

    s = _run(list(paths), o)
    if o["as_json"]:
        click.echo(json.dumps(s, default=str))
    else:
        click.echo(render_text(s), nl=False)
    if o["html"] is not None and not o["quiet"]:
        click.echo(f"HTML report: {o['html']}", err=o["as_json"])


@command.command("diff")
@click.argument("before", type=click.Path(exists=True, path_type=Path))
@click.argument("after", type=click.Path(exists=True, path_type=Path))
@_analysis_options
def diff_command(before: Path, after: Path, **o: Any) -> None:
    """Where the step time went between two runs: BEFORE and AFTER are each a
    directory (or file) of per-rank traces."""
    from rankwatch.explain.analysis import analyze
    from rankwatch.explain.diff import compare, render_diff

    opts = _options(o)
    progress = _progress(o["quiet"] or o["as_json"])
    result = compare(analyze([before], opts, progress), analyze([after], opts, progress))
    if o["html"] is not None:
        from rankwatch.explain.html import write_diff_html

        write_diff_html(result, o["html"])
    if o["as_json"]:
        click.echo(json.dumps(result, default=str))
    else:
        click.echo(render_diff(result), nl=False)
    if o["html"] is not None and not o["quiet"]:
        click.echo(f"HTML report: {o['html']}", err=o["as_json"])
