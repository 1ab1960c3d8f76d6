"""`rankwatch demo`: a 4-rank job that develops a straggler, recorded and analysed.

No GPU needed: the real plugin is driven by the fake NCCL driver, in the call
orders real NCCL uses, and the records go through the same analysis as a real job's.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from rankwatch.collect.fake_job import FakeJob, Straggler, run_fake_job


@click.command(name="demo")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("rankwatch-demo"), show_default=True,
              help="Where the records (OUT/records) and the report (OUT/report.html) go.")
@click.option("--ranks", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--steps", type=click.IntRange(10, 100000), default=80, show_default=True)
@click.option("--slow-rank", type=int, default=2, show_default=True,
              help="The rank that becomes a straggler.")
@click.option("--cause", type=click.Choice(["host", "gpu", "transfer"]), default="gpu",
              show_default=True, help="Why it is late.")
@click.option("--delay-us", type=click.IntRange(1, 10_000_000), default=2000,
              show_default=True)
def command(out_dir: Path, ranks: int, steps: int, slow_rank: int, cause: str,
            delay_us: int) -> None:
    """Run a small fake job with a straggler through the plugin, then analyse it."""
    if not 0 <= slow_rank < ranks:
        raise click.BadParameter(f"must be below --ranks ({ranks})", param_hint="--slow-rank")
    records = out_dir / "records"
    if records.exists():
        for old in records.glob("*"):
            old.unlink()
    straggler = Straggler(rank=slow_rank, from_step=steps // 2, cause=cause, delay_us=delay_us)
    job = FakeJob(ranks=ranks, steps=steps, straggler=straggler)
    click.echo(f"rankwatch demo: {ranks} ranks x {steps} steps on the fake NCCL driver; "
               f"rank {slow_rank} turns {cause}-slow by {delay_us} us at step {steps // 2}")
    started = time.monotonic()
    run_fake_job(job, records)
    click.echo(f"recorded in {time.monotonic() - started:.1f} s to {records}\n")
    from rankwatch.cli.analyze import analyze, render_text

    report = out_dir / "report.html"
    click.echo(render_text(analyze((records,), None, quiet=True, html=report)))
    click.echo(f"HTML report: {report}")
