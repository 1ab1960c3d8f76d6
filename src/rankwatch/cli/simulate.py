"""`rankwatch simulate`: write the records of a synthetic job, with known faults."""

from __future__ import annotations

import time
from pathlib import Path

import click

from rankwatch.errors import ConfigError


def _fault(kind: str, rank: int | None, step: int | None, **extra: object):
    """A fault dataclass when its rank option was given; step options must come along."""
    from rankwatch.simulate import DesyncFault, HangFault, SlowFault

    if rank is None:
        return None
    if step is None:
        raise ConfigError(f"--{kind}-rank needs its step option too (see --help)")
    if kind == "slow":
        return SlowFault(rank, step, str(extra["cause"]), float(extra["us"]))  # type: ignore[arg-type]
    if kind == "hang":
        return HangFault(rank, step)
    return DesyncFault(rank, step, str(extra["desync_kind"]))


def _config(opts: dict):
    from rankwatch.simulate import SimConfig

    names = ("ranks", "hosts", "steps", "tp", "pp", "dp", "seed", "clock_offset_us", "drift_ppm",
             "one_process_per_host", "workers")  # fmt: skip
    return SimConfig(
        **{n: opts[n] for n in names},  # type: ignore[arg-type]
        slow=_fault("slow", opts["slow_rank"], opts["slow_from_step"], cause=opts["slow_cause"],
                    us=opts["slow_us"]),
        hang=_fault("hang", opts["hang_rank"], opts["hang_at_step"]),
        desync=_fault("desync", opts["desync_rank"], opts["desync_at_step"],
                      desync_kind=opts["desync_kind"]),
    )  # fmt: skip


@click.command("simulate")
@click.option("--ranks", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--hosts", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=50, show_default=True)
@click.option(
    "--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel size."
)
@click.option(
    "--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline-parallel size."
)
@click.option(
    "--dp",
    type=click.IntRange(min=1),
    default=None,
    help="Data-parallel size [default: ranks / (tp * pp)].",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--clock-offset-us",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Each host's clock is off by up to this much.",
)
@click.option(
    "--drift-ppm",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Each host's clock drifts by up to this much.",
)
@click.option("--slow-rank", type=int, default=None, help="Make this rank slow...")
@click.option("--slow-from-step", type=int, default=None, help="...from this step on...")
@click.option(
    "--slow-cause",
    type=click.Choice(["host", "gpu", "transfer"]),
    default="host",
    show_default=True,
    help="...late API calls, late GPU start, or slow transfers...",
)
@click.option(
    "--slow-us",
    type=click.FloatRange(min=0, min_open=True),
    default=2000.0,
    show_default=True,
    help="...by this many microseconds per step.",
)
@click.option("--hang-rank", type=int, default=None, help="This rank stops issuing NCCL calls...")
@click.option("--hang-at-step", type=int, default=None, help="...at this step.")
@click.option("--desync-rank", type=int, default=None, help="This rank issues a mismatched op...")
@click.option("--desync-at-step", type=int, default=None, help="...at this step...")
@click.option(
    "--desync-kind",
    type=click.Choice(["size", "func"]),
    default="size",
    show_default=True,
    help="...of a different size, or a different function.",
)
@click.option(
    "--one-process-per-host",
    is_flag=True,
    help="Each host's ranks in one process driving all its GPUs (as a single-controller "
    "JAX program), told apart by device.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    help="Writer processes [default: one per CPU].",
)
@click.argument("outdir", type=click.Path(file_okay=False, path_type=Path))
def command(outdir: Path, **opts: object) -> None:
    """Write a synthetic job's records into OUTDIR, with truth.json describing it.

    Files are exactly what the plugin writes (<host>-pid<pid>.log op records and
    .rwstate.jsonl state records), with realistic noise, per-host clock offsets
    and drift, and the faults asked for. Example:

      rankwatch simulate --ranks 64 --hosts 8 --steps 500 --clock-offset-us 5000
      --drift-ppm 10 --slow-rank 13 --slow-from-step 200 --slow-cause gpu out/
    """
    from rankwatch.simulate import simulate

    cfg = _config(opts)
    start = time.perf_counter()
    result = simulate(cfg, outdir)
    seconds = time.perf_counter() - start
    records = result.op_records
    click.echo(
        f"rankwatch: wrote {records} op records of {cfg.ranks} ranks on {cfg.hosts} "
        f"host(s) to {outdir} in {seconds:.1f} s ({records / max(seconds, 1e-9):,.0f} "
        "records/s); ground truth in truth.json"
    )
