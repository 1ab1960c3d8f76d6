"""`rankwatch plugin-path`: print where the profiler plugin is installed."""

from __future__ import annotations

import click

from rankwatch.collect.plugin import plugin_path


@click.command("plugin-path")
def command() -> None:
    """Print the absolute path of the NCCL profiler plugin (.so).

    Use it as NCCL_PROFILER_PLUGIN="$(rankwatch plugin-path)".
    """
    click.echo(str(plugin_path()))
