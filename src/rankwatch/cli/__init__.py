"""The `rankwatch` command line.

Each subcommand is one module in this package exposing a click command named
`command`; adding one is one file plus one line in SUBCOMMANDS.
"""

from __future__ import annotations

import importlib

import click

from rankwatch import __version__
from rankwatch.alloc import keep_freed_memory
from rankwatch.errors import RankwatchError

# Modules under rankwatch.cli, in --help order; the command name is the module
# name with "-" for "_". They are imported only when needed, so `plugin-path`
# stays fast however heavy the imports of other subcommands become.
SUBCOMMANDS: tuple[str, ...] = (
    "run",
    "env",
    "plugin_path",
    "analyze",
    "simulate",
    "demo",
    "monitor",
    "trace",
    "agent",
)


_MODULE_OF: dict[str, str] = {module.replace("_", "-"): module for module in SUBCOMMANDS}


class _LazyGroup(click.Group):
    """A group that imports a subcommand's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_MODULE_OF)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _MODULE_OF.get(cmd_name)
        if module is None:
            return None
        return importlib.import_module(f"{__name__}.{module}").command

    def invoke(self, ctx: click.Context) -> object:
        # rankwatch's own errors are expected failures: one line, no traceback,
        # and the exit code the error class chose.
        try:
            return super().invoke(ctx)
        except RankwatchError as exc:
            click.echo(f"rankwatch: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__, "--version", "-V", prog_name="rankwatch", message="%(prog)s %(version)s"
)
def main() -> None:
    """Per-rank observability for distributed GPU training (NCCL profiler plugin)."""
    keep_freed_memory()  # this process only (see rankwatch.alloc)
