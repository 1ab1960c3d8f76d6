"""Options shared by subcommands: those that start the plugin (env, run), and those
that take plugin streams (monitor, agent)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from rankwatch.collect.env import GPU_TIMING_MODES

F = TypeVar("F", bound=Callable[..., object])

_PLUGIN_OPTIONS = (
    click.option(
        "--dump-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Directory for the record files [default: ./rankwatch-<UTC time>].",
    ),
    click.option(
        "--interval-ms",
        type=click.IntRange(min=1),
        default=None,
        help="Period of progress, clock and stats records, in milliseconds.",
    ),
    click.option(
        "--gpu-timing",
        type=click.Choice(GPU_TIMING_MODES),
        default=None,
        help="Per-channel GPU kernel timing: on, off, or sampled.",
    ),
    click.option(
        "--min-size",
        type=click.IntRange(min=0),
        default=None,
        metavar="BYTES",
        help="Skip ops smaller than this many bytes (they are still counted).",
    ),
    click.option("--prom", is_flag=True, help="Also write Prometheus text files."),
    click.option(
        "--job-id",
        default=None,
        help="Job id stamped into records [default: SLURM_JOB_ID or TORCHELASTIC_RUN_ID].",
    ),
)


def plugin_options(func: F) -> F:
    """Add the plugin settings as options; they reach the command as keywords."""
    for option in reversed(_PLUGIN_OPTIONS):
        func = option(func)
    return func


# monitor and agent: the collector token and the file that tells scripts where they bound
token_option = click.option(
    "--token",
    envvar="RANKWATCH_COLLECTOR_TOKEN",
    metavar="TOKEN",
    default=None,
    help="Shared token the plugins send (RANKWATCH_COLLECTOR_TOKEN); required for any "
    "listener that is not loopback, and then for every stream.",
)
ready_file_option = click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the bound addresses here as JSON once listening (for scripts).",
)


def _detect_config(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]):  # noqa: ANN202
    """--detect settings as a detect.Config (None: the defaults)."""
    if not value:
        return None
    from rankwatch.detect.base import config_from
    from rankwatch.errors import ConfigError

    try:
        return config_from(value)
    except ConfigError as err:
        raise click.BadParameter(err.message, ctx=ctx, param=param) from None


# analyze and monitor: the detectors' thresholds (detect.base.Config, docs/detection.md)
detect_option = click.option(
    "--detect",
    "detect_config",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_detect_config,
    help="Set a detector threshold, e.g. --detect chance_runs=0 (always three late steps) "
    "or --detect z_hit=8; repeatable. Names and defaults: docs/detection.md.",
)
