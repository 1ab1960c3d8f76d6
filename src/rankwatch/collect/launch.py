"""Run a command with the plugin enabled, then say where its records are."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rankwatch.collect.env import plugin_env, prepare_dump_dir, resolve_dump_dir
from rankwatch.errors import ConfigError

FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
OP_RECORD_SUFFIX = ".log"
STATE_RECORD_SUFFIX = ".rwstate.jsonl"
_POLL_S = 0.05


@dataclass(frozen=True)
class DumpSummary:
    """What a run left in its dump directory."""

    op_files: int
    op_lines: int
    state_files: int
    state_lines: int


def run_with_plugin(
    cmd: list[str],
    dump_dir: str | os.PathLike[str] | None = None,
    *,
    stderr: TextIO | None = None,
    monitor: str | None = None,
    **settings: Any,
) -> int:
    """Run cmd with the plugin's environment; return its exit code.

    dump_dir defaults to ./rankwatch-<UTC time>. settings are plugin_env's keyword
    options (interval_ms, gpu_timing, min_size, prom, job_id). SIGINT and SIGTERM
    sent to this process are passed on to the child. A child killed by signal N
    gives 128 + N, as a shell reports it. monitor: HOST:PORT to run a `rankwatch
    monitor` beside the job, serving its page there; it is stopped after the job
    and prints its findings.
    """
    if not cmd:
        raise ConfigError("no command to run", field="cmd")
    directory = resolve_dump_dir(dump_dir)
    env = {**os.environ, **plugin_env(directory, **settings)}  # validates settings
    prepare_dump_dir(directory)
    attached = None
    if monitor is not None:
        from rankwatch.serve.attach import start_monitor

        attached = start_monitor(directory, monitor, stderr or sys.stderr)
        env.update(attached.env)
    try:
        code = _run_forwarding_signals(cmd, env)
    finally:
        if attached is not None:
            attached.stop(stderr or sys.stderr)
    report_dump(directory, stderr or sys.stderr)
    return code


def _spawn(cmd: list[str], env: dict[str, str], sigmask: set[signal.Signals] | None) -> int:
    # posix_spawn sets the child's signal mask atomically, so the parent can block
    # the forwarded signals before the child exists without the child inheriting
    # the block. SIGPIPE and SIGXFSZ go back to their defaults as subprocess does
    # (Python ignores them); everything else is inherited unchanged.
    options: dict[str, Any] = {"setsigdef": (signal.SIGPIPE, signal.SIGXFSZ)}
    if sigmask is not None:
        options["setsigmask"] = sigmask
    try:
        return os.posix_spawnp(cmd[0], cmd, env, **options)
    except OSError as exc:
        raise ConfigError(f"cannot run {cmd[0]!r}: {exc.strerror}", field="cmd") from exc


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _poll(pid: int) -> int | None:
    """The child's exit code once it has exited, else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return _exit_code(status) if done else None


def _run_forwarding_signals(cmd: list[str], env: dict[str, str]) -> int:
    # Signals can only be waited for synchronously in the main thread; elsewhere
    # the caller owns signal handling and the child is simply waited for.
    if threading.current_thread() is not threading.main_thread():
        return _exit_code(os.waitpid(_spawn(cmd, env, None), 0)[1])
    # Block (not handle) the signals so they can be read with their sender:
    # Ctrl-C from the terminal already reached the child through its process
    # group, and sending it again would interrupt the child's own cleanup.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        pid = _spawn(cmd, env, before)
        while (code := _poll(pid)) is None:
            info = signal.sigtimedwait(FORWARDED_SIGNALS, _POLL_S)
            if info is not None and not _sent_by_terminal(info, pid):
                _forward(pid, info.si_signo)
        return code
    finally:
        _drain_pending(set(FORWARDED_SIGNALS) - before)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _sent_by_terminal(info: signal.struct_siginfo, child_pid: int) -> bool:
    # The tty driver signals the whole foreground process group with a kernel
    # si_code (> 0) and no sender pid; kill(2) sends SI_USER (0) or SI_QUEUE (< 0)
    # with the sender's pid.
    if info.si_code <= 0 or info.si_pid != 0:
        return False
    try:
        return os.getpgid(child_pid) == os.getpgrp()
    except ProcessLookupError:
        return True  # already gone: nothing to forward to


def _forward(pid: int, signo: int) -> None:
    # The child is not reaped yet, so its pid cannot have been reused; it may
    # have exited since the poll, which leaves nothing to stop.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signo)


def _drain_pending(signals: set[signal.Signals]) -> None:
    # A signal that arrived after the child exited was meant for the child; do
    # not let it kill this process once unblocked.
    while signal.sigpending() & signals:
        signal.sigtimedwait(signals, 0)


def summarize_dump(directory: Path) -> DumpSummary:
    """Count record files and lines the plugin wrote into directory."""
    op = sorted(directory.glob(f"*{OP_RECORD_SUFFIX}"))
    state = sorted(directory.glob(f"*{STATE_RECORD_SUFFIX}"))
    return DumpSummary(len(op), _count_lines(op), len(state), _count_lines(state))


def _count_lines(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        with path.open("rb") as stream:
            total += sum(1 for _ in stream)
    return total


def report_dump(directory: Path, stream: TextIO) -> None:
    """Tell the user where the records are and how much was written."""
    s = summarize_dump(directory)
    print(
        f"rankwatch: records in {directory}: {s.op_files} op-record file(s) "
        f"({s.op_lines} lines), {s.state_files} state file(s) ({s.state_lines} lines)",
        file=stream,
    )
    if s.op_files == 0 and s.state_files == 0:
        print(
            "rankwatch: no records were written; did the command initialise NCCL "
            "(RANKWATCH_ENABLE=1 and NCCL_PROFILER_PLUGIN were set for it)?",
            file=stream,
        )
