"""`rankwatch run`: run a command with the plugin enabled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rankwatch.cli._options import plugin_options
from rankwatch.collect.launch import run_with_plugin


# Option parsing stops at the command's first word, so its own options
# (`rankwatch run torchrun --nproc_per_node 8 ...`) pass through untouched.
@click.command("run", context_settings={"allow_interspersed_args": False})
@plugin_options
@click.option(
    "--monitor",
    "monitor",
    is_flag=True,
    help="Also run `rankwatch monitor` for the job: live page, metrics and alerts while "
    "it runs, its findings when it ends.",
)
@click.option(
    "--monitor-http",
    default="127.0.0.1:0",
    show_default=True,
    metavar="HOST:PORT",
    help="Where the monitor serves its page and /metrics (port 0: any free port).",
)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] CMD...")
@click.pass_context
def command(
    ctx: click.Context,
    cmd: tuple[str, ...],
    dump_dir: Path | None,
    monitor: bool,
    monitor_http: str,
    **settings: Any,
) -> None:
    """Run CMD with rankwatch enabled and exit with its exit code.

    Example: rankwatch run -- torchrun --nproc_per_node 8 train.py
    (add --monitor to watch it live: rankwatch run --monitor -- CMD)
    """
    http = monitor_http if monitor else None
    ctx.exit(run_with_plugin(list(cmd), dump_dir, monitor=http, **settings))
