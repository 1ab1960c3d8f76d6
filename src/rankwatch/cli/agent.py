"""`rankwatch agent`: the per-node relay from the ranks' streams to NATS."""

from __future__ import annotations

import socket
from pathlib import Path

import click

from rankwatch.cli._options import ready_file_option, token_option

DEFAULT_LISTEN = "tcp://127.0.0.1:9471"


@click.command("agent")
@click.option(
    "--listen",
    "listen",
    multiple=True,
    metavar="ADDR",
    help="Take the local ranks' streams on unix:/path or tcp://host:port (repeatable) "
    f"[default: {DEFAULT_LISTEN}]. Point ranks at it with RANKWATCH_COLLECTOR=ADDR.",
)
@click.option(
    "--nats",
    "nats_url",
    default="nats://127.0.0.1:4222",
    show_default=True,
    metavar="URL",
    help="NATS server to publish to (nats://[token@]host:port).",
)
@token_option
@click.option("--name", default=None, metavar="NAME",
              help="This agent's name [default: host name].")  # fmt: skip
@click.option("--buckets", type=click.IntRange(min=1, max=4096), default=64, show_default=True,
              help="Communicator buckets (every agent and worker must agree).")  # fmt: skip
@click.option(
    "--sample",
    "sample_every",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Forward 1 op record in N, chosen by a hash of (communicator, seq) so every rank "
    "keeps the same ones (summaries still count all). 1: forward all.",
)
@click.option("--window", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between heartbeats and summaries.")  # fmt: skip
@click.option(
    "--status-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the agent's counters here as JSON every window.",
)
@ready_file_option
def command(
    listen: tuple[str, ...],
    nats_url: str,
    token: str | None,
    name: str | None,
    buckets: int,
    sample_every: int,
    window: float,
    status_file: Path | None,
    ready_file: Path | None,
) -> None:
    """Relay this node's ranks to NATS for `rankwatch monitor --nats` workers: each
    communicator's records to its bucket, progress heartbeats and per-window summaries
    (see docs/scale.md). Needs `pip install 'rankwatch[nats]'`.

    Example: rankwatch agent --listen unix:/tmp/rw.sock --nats nats://head:4222, then run
    the ranks with RANKWATCH_COLLECTOR=unix:/tmp/rw.sock
    """
    from rankwatch.serve.agent import Agent, AgentConfig

    cfg = AgentConfig(
        listen=list(listen) or [DEFAULT_LISTEN],
        nats=nats_url,
        token=token or None,
        name=name or socket.gethostname(),
        buckets=buckets,
        sample_every=sample_every,
        window_s=window,
        status_file=status_file,
        ready_file=ready_file,
    )
    raise SystemExit(Agent(cfg).run())
