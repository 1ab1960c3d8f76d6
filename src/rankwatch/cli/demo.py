"""`rankwatch demo`: a 4-rank job that develops a straggler, recorded and analysed.

No GPU needed: the real plugin is driven by the fake NCCL driver, in the call
orders real NCCL uses, and the records go through the same analysis as a real job's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from rankwatch.collect.fake_job import FakeJob, Straggler, run_fake_job, step_of

# an onset this many steps from the injected one is that one (a late op just before it,
# or a confirmation that begins its run a step later)
ONSET_SLACK_STEPS = 2


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
    summary = analyze((records,), None, quiet=True, html=report)
    click.echo(render_text(summary))
    click.echo("\n".join(verdict(straggler, summary.get("findings") or [])) + "\n")
    click.echo(f"HTML report: {report}")


def _steps(f: dict[str, Any]) -> tuple[int | None, int | None]:
    """The steps of a finding's onset and of the op that confirmed it."""
    ev = f.get("evidence") or {}
    onset, det = ev.get("onset") or {}, ev.get("detected_at") or {}
    seq = (f.get("since") or {}).get("seq")
    start = step_of(onset.get("func", ""), seq) if seq is not None else None
    end = step_of(det.get("func", ""), det["seq"]) if det.get("seq") is not None else None
    return start, end


def _matching(s: Straggler, findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The finding of the injected straggler: a straggler finding of its rank (any
    cause: a wrong cause is still the rank found), else, for a slow transfer, the
    communicator's finding without a rank (see verdict)."""
    slow = [f for f in findings if f.get("kind") == "straggler"]
    mine = [f for f in slow if f.get("rank") == s.rank]
    mine.sort(key=lambda f: f.get("cause") != s.cause)  # the right cause first
    if mine:
        return mine[0]
    if s.cause == "transfer":
        return next((f for f in slow if f.get("rank") is None and f.get("cause") == s.cause),
                    None)  # fmt: skip
    return None


def _found_lines(s: Straggler, hit: dict[str, Any]) -> list[str]:
    """What was found of the injected straggler, and where it differs from what was
    injected (cause, onset)."""
    start, end = _steps(hit)
    when = f"since step {start}" if start is not None else "onset unknown"
    confirmed = f", confirmed at step {end}" if end is not None else ""
    cost = f"; it cost the job {hit['cost_s']:.3f} s" if hit.get("cost_s") is not None else ""
    who = f"rank {s.rank}" if hit.get("rank") is not None else "the communicator"
    lines = [f"  found:    {who}, cause {hit.get('cause')}, {when}{confirmed}{cost}"]
    if hit.get("cause") != s.cause:
        lines.append(f"            the cause differs: {s.cause} was injected")
    off = start - s.from_step if start is not None else 0
    if off < -ONSET_SLACK_STEPS:
        lines.append(
            f"            the onset is {-off} steps early: the rank was already late then, "
            "by delays nobody injected"
        )
    elif off > ONSET_SLACK_STEPS:
        lines.append(f"            the onset is {off} steps after the injected one")
    if hit.get("rank") is None:
        lines.append(
            "            (one communicator cannot tell whose link is slow: every op\n"
            "            involves every rank; jobs with several communicators can)"
        )
    return lines


def verdict(injected: Straggler, findings: list[dict[str, Any]]) -> list[str]:
    """What the demo injected against what was found, in plain words: the injected
    straggler (its rank; cause and onset compared) and any finding nobody injected."""
    s = injected
    lines = [
        "What the demo injected, and what rankwatch found:",
        f"  injected: rank {s.rank}, {s.cause}-slow by {s.delay_us} us per step from step "
        f"{s.from_step}",
    ]
    hit = _matching(s, findings)
    if hit is None:
        lines.append("  found:    nothing matching it (see the findings above)")
    else:
        lines += _found_lines(s, hit)
    others = [f for f in findings if f is not hit]
    for f in others:
        who = f"rank {f['rank']}" if f.get("rank") is not None else "a communicator"
        cause = f", cause {f['cause']}" if f.get("cause") else ""
        cost = f", cost {f['cost_s']:.3f} s" if f.get("cost_s") is not None else ""
        lines.append(f"  also:     {f['kind']} {who}{cause}{cost}: not injected")
    if others:
        lines.append(
            "            The fake ranks only sleep between ops, so delays nobody injected\n"
            "            come from the host: its scheduler waking a rank late, common when\n"
            "            the ranks share few CPU cores; the report shows the evidence."
        )
    return lines
