"""The environment that makes NCCL load the rankwatch plugin."""

from __future__ import annotations

import datetime as _dt
import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from rankwatch.collect.plugin import plugin_path
from rankwatch.errors import ConfigError

GPU_TIMING_MODES: tuple[str, ...] = ("on", "off", "sampled")


def default_dump_dir(now: _dt.datetime | None = None) -> Path:
    """./rankwatch-<UTC yyyymmdd-HHMMSS>, absolute, so child processes that
    change directory still write to the same place."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return Path.cwd() / f"rankwatch-{now.strftime('%Y%m%d-%H%M%S')}"


def resolve_dump_dir(dump_dir: str | os.PathLike[str] | None) -> Path:
    """The absolute dump directory to use: the one given, else the default."""
    return default_dump_dir() if dump_dir is None else Path(dump_dir).absolute()


def prepare_dump_dir(dump_dir: str | os.PathLike[str]) -> Path:
    """Create the dump directory if needed and return its absolute path."""
    path = Path(dump_dir).absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create dump directory: {exc.strerror}", file=path) from exc
    return path


def _int_setting(name: str, value: int | None, minimum: int) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"must be an integer >= {minimum}, got {value!r}", field=name)
    return str(value)


def _optional_settings(
    interval_ms: int | None,
    gpu_timing: str | None,
    min_size: int | None,
    prom: bool,
    job_id: str | None,
) -> dict[str, str]:
    if gpu_timing is not None and gpu_timing not in GPU_TIMING_MODES:
        modes = ", ".join(GPU_TIMING_MODES)
        raise ConfigError(f"must be one of {modes}, got {gpu_timing!r}", field="gpu_timing")
    settings = {
        "RANKWATCH_INTERVAL_MS": _int_setting("interval_ms", interval_ms, 1),
        "RANKWATCH_GPU_TIMING": gpu_timing,
        "RANKWATCH_MIN_SIZE_BYTES": _int_setting("min_size", min_size, 0),
        "RANKWATCH_PROM": "1" if prom else None,
        "RANKWATCH_JOB_ID": job_id or None,
    }
    return {key: value for key, value in settings.items() if value is not None}


def plugin_env(
    dump_dir: str | os.PathLike[str],
    *,
    interval_ms: int | None = None,
    gpu_timing: str | None = None,
    min_size: int | None = None,
    prom: bool = False,
    job_id: str | None = None,
) -> dict[str, str]:
    """Variables that enable the plugin: set them in every rank's environment.

    Only the settings given are returned; the plugin's own defaults apply to the rest.
    """
    env = {
        "NCCL_PROFILER_PLUGIN": str(plugin_path()),
        "RANKWATCH_ENABLE": "1",
        "RANKWATCH_DUMP_DIR": str(Path(dump_dir).absolute()),
    }
    env.update(_optional_settings(interval_ms, gpu_timing, min_size, prom, job_id))
    return env


def shell_exports(env: Mapping[str, str]) -> str:
    """POSIX `export K=V` lines, quoted so `eval "$(...)"` reproduces every value."""
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
