"""The environment that makes NCCL load the rankwatch plugin."""

from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from rankwatch.collect.plugin import plugin_path
from rankwatch.errors import ConfigError

GPU_TIMING_MODES: tuple[str, ...] = ("on", "off", "sampled")

# What the plugin accepts for streaming (docs/plugin.md, docs/stream-protocol.md).
_TCP_COLLECTOR = re.compile(r"tcp://(\[[^\]/]+\]|[^:/\[\]]+):([0-9]{1,5})")
_UNIX_PATH_MAX = 107  # bytes: sun_path less its terminating NUL
TOKEN_MAX_BYTES = 256
STREAM_QUEUE_BYTES_RANGE = (128 * 1024, 1024**3)


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


def _collector_setting(collector: str | None) -> str | None:
    """RANKWATCH_COLLECTOR as the plugin parses it: unix:PATH or tcp://HOST:PORT."""
    if not collector:
        return None
    if collector.startswith("unix:"):
        if 0 < len(collector[5:].encode()) <= _UNIX_PATH_MAX:
            return collector
    else:
        match = _TCP_COLLECTOR.fullmatch(collector)
        if match and 1 <= int(match.group(2)) <= 65535:
            return collector
    raise ConfigError(
        "must be unix:PATH (a path under 108 bytes) or tcp://HOST:PORT "
        f"(tcp://[ADDRESS]:PORT for IPv6), got {collector!r}",
        field="collector",
    )


def _stream_settings(
    collector: str | None, collector_token: str | None, stream_queue_bytes: int | None
) -> dict[str, str | None]:
    if collector_token and len(collector_token.encode()) > TOKEN_MAX_BYTES:
        raise ConfigError(f"must be at most {TOKEN_MAX_BYTES} bytes", field="collector_token")
    low, high = STREAM_QUEUE_BYTES_RANGE
    queue = _int_setting("stream_queue_bytes", stream_queue_bytes, low)
    if stream_queue_bytes is not None and stream_queue_bytes > high:
        raise ConfigError(
            f"must be at most {high}, got {stream_queue_bytes}", field="stream_queue_bytes"
        )
    return {
        "RANKWATCH_COLLECTOR": _collector_setting(collector),
        "RANKWATCH_COLLECTOR_TOKEN": collector_token or None,
        "RANKWATCH_STREAM_QUEUE_BYTES": queue,
    }


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
    collector: str | None = None,
    collector_token: str | None = None,
    stream_queue_bytes: int | None = None,
) -> dict[str, str]:
    """Variables that enable the plugin: set them in every rank's environment.

    Only the settings given are returned; the plugin's own defaults apply to the rest.
    collector (RANKWATCH_COLLECTOR) also streams every record to a collector, see
    docs/stream-protocol.md.
    """
    env = {
        "NCCL_PROFILER_PLUGIN": str(plugin_path()),
        "RANKWATCH_ENABLE": "1",
        "RANKWATCH_DUMP_DIR": str(Path(dump_dir).absolute()),
    }
    env.update(_optional_settings(interval_ms, gpu_timing, min_size, prom, job_id))
    stream = _stream_settings(collector, collector_token, stream_queue_bytes)
    env.update({key: value for key, value in stream.items() if value is not None})
    return env


def shell_exports(env: Mapping[str, str]) -> str:
    """POSIX `export K=V` lines, quoted so `eval "$(...)"` reproduces every value."""
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
