"""Settings of a simulated job, checked once when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from rankwatch.errors import ConfigError

SLOW_CAUSES: tuple[str, ...] = ("host", "gpu", "transfer")
DESYNC_KINDS: tuple[str, ...] = ("size", "func")


@dataclass(frozen=True)
class SlowFault:
    """From step `from_step` on, `rank` is slow by `us` microseconds per step.

    host: its API calls come late (late data, CPU stall); gpu: API on time, GPU
    starts late (slow kernels before the collective); transfer: every op that
    involves the rank transfers slower (bad link/NIC).
    """

    rank: int
    from_step: int
    cause: str
    us: float


@dataclass(frozen=True)
class HangFault:
    """At step `at_step`, `rank` stops issuing NCCL calls; its peers block forever."""

    rank: int
    at_step: int


@dataclass(frozen=True)
class DesyncFault:
    """At step `at_step`, `rank` issues a different size (or function) at the same seq."""

    rank: int
    at_step: int
    kind: str = "size"


@dataclass(frozen=True)
class SimConfig:
    """A synthetic job: layout, workload, clocks and injected faults."""

    ranks: int = 8
    hosts: int = 1
    steps: int = 50
    tp: int = 1
    pp: int = 1
    dp: int | None = None  # default: ranks / (tp * pp)
    seed: int = 0
    clock_offset_us: float = 0.0  # each host's clock is off by up to this much
    drift_ppm: float = 0.0  # and drifts by up to this much
    tp_layers: int = 4  # TP AllReduces per forward and per backward
    dp_buckets: int = 4  # gradient AllReduce buckets per step
    job_id: str = "sim"
    start_ns: int = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    interval_ms: int = 1000  # period of progress / clock / stats records
    slow: SlowFault | None = None
    hang: HangFault | None = None
    desync: DesyncFault | None = None
    # one process per host drives all its GPUs (a single-controller JAX program):
    # its ranks share a pid and a pair of files, told apart by their device
    one_process_per_host: bool = False
    workers: int = 0  # writer processes; 0 = one per CPU (at most 2 per file set)
    _dp: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        _check_layout(self)
        object.__setattr__(self, "_dp", self.dp or self.ranks // (self.tp * self.pp))
        _check_faults(self)

    @property
    def dp_size(self) -> int:
        return self._dp

    @property
    def ranks_per_host(self) -> int:
        return self.ranks // self.hosts


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_layout(cfg: SimConfig) -> None:
    _need(cfg.ranks >= 1, f"--ranks must be >= 1, got {cfg.ranks}")
    _need(cfg.hosts >= 1, f"--hosts must be >= 1, got {cfg.hosts}")
    _need(cfg.ranks % cfg.hosts == 0, f"--ranks {cfg.ranks} is not a multiple of --hosts")
    _need(cfg.steps >= 1, f"--steps must be >= 1, got {cfg.steps}")
    _need(cfg.tp >= 1 and cfg.pp >= 1, "--tp and --pp must be >= 1")
    _need(cfg.ranks % (cfg.tp * cfg.pp) == 0, "--ranks must be a multiple of tp * pp")
    dp = cfg.dp or cfg.ranks // (cfg.tp * cfg.pp)
    _need(cfg.tp * cfg.pp * dp == cfg.ranks, f"tp*pp*dp = {cfg.tp * cfg.pp * dp} != --ranks")
    _need(cfg.clock_offset_us >= 0 and cfg.drift_ppm >= 0, "clock settings must be >= 0")
    _need(cfg.interval_ms >= 1, "interval must be >= 1 ms")
    _need(cfg.tp_layers >= 1 and cfg.dp_buckets >= 1, "tp_layers and dp_buckets must be >= 1")
    _need(
        not cfg.one_process_per_host or cfg.ranks_per_host <= 8,
        f"--one-process-per-host: {cfg.ranks_per_host} ranks per host, but a simulated "
        "process drives at most 8 GPUs (devices 0-7)",
    )


def _check_rank_step(what: str, rank: int, step: int, cfg: SimConfig) -> None:
    _need(0 <= rank < cfg.ranks, f"--{what}-rank {rank} is not a rank of a {cfg.ranks}-rank job")
    _need(0 <= step < cfg.steps, f"--{what} step {step} is outside 0..{cfg.steps - 1}")


def _check_faults(cfg: SimConfig) -> None:
    if cfg.slow is not None:
        _check_rank_step("slow", cfg.slow.rank, cfg.slow.from_step, cfg)
        _need(cfg.slow.cause in SLOW_CAUSES, f"--slow-cause must be one of {SLOW_CAUSES}")
        _need(cfg.slow.us > 0, "--slow-us must be > 0")
    if cfg.hang is not None:
        _check_rank_step("hang", cfg.hang.rank, cfg.hang.at_step, cfg)
    if cfg.desync is not None:
        _check_rank_step("desync", cfg.desync.rank, cfg.desync.at_step, cfg)
        _need(cfg.desync.kind in DESYNC_KINDS, f"desync kind must be one of {DESYNC_KINDS}")
        _need(cfg.ranks > 1, "a desync needs at least 2 ranks")
