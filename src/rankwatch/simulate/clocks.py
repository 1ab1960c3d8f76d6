"""Clock errors of a simulated job: per-host wall-clock offset and drift, and
per-process GPU-to-host conversion offsets as the plugin would estimate them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.simulate.config import SimConfig


@dataclass
class ClockModel:
    start_ns: int
    host_offset_ns: np.ndarray  # (H,) host clock minus true time at the job start
    host_drift_ppm: np.ndarray  # (H,)
    gpu_offset_ns: np.ndarray  # (N,) true host-minus-GPU-timer offset per process
    gpu_error_ns: np.ndarray  # (N,) half-width of the plugin's bound on it
    gpu_est_error_ns: np.ndarray  # (N,) plugin's estimate minus the truth (|.| <= bound)

    @classmethod
    def draw(cls, cfg: SimConfig, rng: np.random.Generator) -> ClockModel:
        h, n = cfg.hosts, cfg.ranks
        offsets = rng.uniform(-1.0, 1.0, h) * cfg.clock_offset_us * 1e3
        drifts = rng.uniform(-1.0, 1.0, h) * cfg.drift_ppm
        gpu_offset = rng.integers(100_000_000, 1_000_000_000, n).astype(np.float64)
        error = rng.integers(500, 2000, n).astype(np.float64)
        est_error = np.round(rng.uniform(-0.5, 0.5, n) * error)
        return cls(cfg.start_ns, offsets, drifts, gpu_offset, error, est_error)

    def host_local(self, host: int, t: np.ndarray) -> np.ndarray:
        """Host `host`'s wall clock (absolute ns, int64) at true times t (ns since start)."""
        local = t + self.host_offset_ns[host] + self.host_drift_ppm[host] * 1e-6 * t
        return self.start_ns + np.rint(local).astype(np.int64)

    def offset_at(self, host: int, t: float) -> float:
        """Host clock minus true time at true time t (ns since start)."""
        return float(self.host_offset_ns[host] + self.host_drift_ppm[host] * 1e-6 * t)
