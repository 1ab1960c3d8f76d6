"""`rankwatch monitor`: live detection, metrics, a web page and alerts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from rankwatch.cli._options import detect_option, ready_file_option, token_option

if TYPE_CHECKING:
    from rankwatch.detect.base import Config

DEFAULT_HTTP = "127.0.0.1:9470"


@click.command("monitor")
@click.option(
    "--listen",
    "listen",
    multiple=True,
    metavar="ADDR",
    help="Take plugin streams on unix:/path or tcp://host:port (repeatable; `none`: no "
    "listener) [default: tcp://127.0.0.1:9471]. Point ranks at it with "
    "RANKWATCH_COLLECTOR=ADDR.",
)
@click.option(
    "--watch",
    "watch",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Also tail the record files under DIR as they grow (repeatable).",
)
@click.option(
    "--http",
    default=DEFAULT_HTTP,
    show_default=True,
    metavar="HOST:PORT",
    help="Serve the page, /api/state and /metrics here (`none`: no HTTP; port 0: any).",
)
@token_option
@click.option("--webhook", metavar="URL", default=None, help="POST each new finding here (JSON).")
@click.option(
    "--parquet",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="Write the processed records as Parquet (store layout, per job) under DIR.",
)
@click.option(
    "--tick",
    type=click.FloatRange(min=0.05, max=5.0),
    default=0.5,
    show_default=True,
    help="Seconds between batches (detection latency is about one tick).",
)
@click.option("--max-jobs", type=click.IntRange(min=1), default=8, show_default=True,
              help="Jobs kept at once (ended ones are forgotten first).")  # fmt: skip
@click.option(
    "--max-rank-series",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Per-rank metric series for jobs up to this many ranks (larger jobs: the latest).",
)
@ready_file_option
@click.option("--nats", "nats_url", default=None, metavar="URL",
              help="Also take records from `rankwatch agent`s via NATS (docs/scale.md).")
@click.option("--queue-group", default="rankwatch", show_default=True, metavar="G",
              help="With --nats: workers of one group split the communicators.")
@detect_option
def command(
    listen: tuple[str, ...],
    watch: tuple[Path, ...],
    http: str,
    token: str | None,
    webhook: str | None,
    parquet: Path | None,
    tick: float,
    max_jobs: int,
    max_rank_series: int,
    ready_file: Path | None,
    nats_url: str | None = None,
    queue_group: str = "rankwatch",
    detect_config: Config | None = None,
) -> None:
    """Watch running jobs live: take every rank's stream (and/or tail record files),
    run the detectors as `rankwatch analyze` does, and serve a live page, Prometheus
    metrics and alerts (stdout, and --webhook).

    Listens on loopback unless told otherwise. Stop it with Ctrl-C: it prints each
    job's findings.

    Example: rankwatch monitor --listen unix:/run/rankwatch.sock, then run the job with
    RANKWATCH_COLLECTOR=unix:/run/rankwatch.sock, and open http://127.0.0.1:9470/
    """
    from rankwatch.serve.job import JobConfig
    from rankwatch.serve.live import StateConfig
    from rankwatch.serve.monitor import Monitor, MonitorConfig, address_list

    cfg = MonitorConfig(
        listen=address_list(listen),
        http=None if http == "none" else http,
        watch=list(watch),
        token=token or None,
        webhook=webhook,
        parquet=parquet,
        tick_s=tick,
        state=StateConfig(
            job=JobConfig(detect=detect_config),
            max_jobs=max_jobs,
            max_ranks_series=max_rank_series,
        ),
        ready_file=ready_file,
    )
    feeds = []
    if nats_url:
        from rankwatch.serve.nats_worker import nats_feed

        feeds.append(nats_feed(nats_url, queue_group))
    raise SystemExit(Monitor(cfg, feeds=feeds).run())
