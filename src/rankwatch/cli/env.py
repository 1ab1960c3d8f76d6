"""`rankwatch env`: print shell exports that enable the plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rankwatch.cli._options import plugin_options
from rankwatch.collect.env import (
    plugin_env,
    prepare_dump_dir,
    resolve_dump_dir,
    shell_exports,
)


@click.command("env")
@plugin_options
def command(dump_dir: Path | None, **settings: Any) -> None:
    """Print `export` lines that make NCCL load rankwatch.

    Use in a job script before the launcher: eval "$(rankwatch env)". The dump
    directory is created now, so every rank finds it.
    """
    directory = resolve_dump_dir(dump_dir)
    exports = shell_exports(plugin_env(directory, **settings))  # validates first
    prepare_dump_dir(directory)
    click.echo(exports, nl=False)
