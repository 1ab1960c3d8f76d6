"""rankwatch.collect.launch: running a command under the plugin, in-process."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

from rankwatch.collect.launch import (
    _sent_by_terminal,
    report_dump,
    run_with_plugin,
    summarize_dump,
)
from rankwatch.errors import ConfigError

SI_USER = 0
SI_KERNEL = 0x80


def _siginfo(code: int, pid: int) -> signal.struct_siginfo:
    # (signo, code, errno, pid, uid, status, band)
    return signal.struct_siginfo((signal.SIGINT, code, 0, pid, 0, 0, 0))


def test_terminal_interrupt_is_recognised_and_not_forwarded_again() -> None:
    # Given a kernel-sent SIGINT (Ctrl-C) while the child shares our process group
    info = _siginfo(SI_KERNEL, 0)
    # Then it already reached the child
    assert _sent_by_terminal(info, os.getpid())


def test_signal_from_kill_is_forwarded() -> None:
    assert not _sent_by_terminal(_siginfo(SI_USER, 1234), os.getpid())


def test_run_returns_the_exit_code_and_reports_to_the_given_stream(tmp_path: Path) -> None:
    out = io.StringIO()
    code = run_with_plugin(["sh", "-c", "exit 5"], tmp_path / "d", stderr=out)
    assert code == 5
    assert f"records in {tmp_path / 'd'}:" in out.getvalue()


def test_run_passes_settings_to_the_child(tmp_path: Path) -> None:
    script = 'echo "$RANKWATCH_INTERVAL_MS $RANKWATCH_JOB_ID" > seen'
    cmd = ["sh", "-c", f"cd '{tmp_path}' && {script}"]
    run_with_plugin(cmd, tmp_path, stderr=io.StringIO(), interval_ms=50, job_id="j1")
    assert (tmp_path / "seen").read_text() == "50 j1\n"


def test_run_works_outside_the_main_thread(tmp_path: Path) -> None:
    # Signals cannot be awaited off the main thread; the child is simply waited for.
    codes: list[int] = []
    worker = threading.Thread(
        target=lambda: codes.append(
            run_with_plugin(["sh", "-c", "exit 9"], tmp_path, stderr=io.StringIO())
        )
    )
    worker.start()
    worker.join(timeout=30)
    assert codes == [9]


def test_run_leaves_the_signal_mask_as_it_found_it(tmp_path: Path) -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    run_with_plugin(["true"], tmp_path, stderr=io.StringIO())
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_empty_command_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no command"):
        run_with_plugin([], tmp_path)


def test_summary_counts_only_record_files(tmp_path: Path) -> None:
    (tmp_path / "a-pid1.log").write_text("{}\n{}\n")
    (tmp_path / "b-pid2.log").write_text("{}\n")
    (tmp_path / "a-pid1.rwstate.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("x\ny\n")
    summary = summarize_dump(tmp_path)
    assert (summary.op_files, summary.op_lines) == (2, 3)
    assert (summary.state_files, summary.state_lines) == (1, 1)


def test_report_names_the_directory_and_counts(tmp_path: Path) -> None:
    (tmp_path / "a-pid1.log").write_text("{}\n")
    out = io.StringIO()
    report_dump(tmp_path, out)
    assert out.getvalue() == (
        f"rankwatch: records in {tmp_path}: 1 op-record file(s) (1 lines), "
        "0 state file(s) (0 lines)\n"
    )


def test_invalid_settings_fail_before_anything_is_created_or_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        run_with_plugin(["touch", str(tmp_path / "ran")], tmp_path / "d", gpu_timing="maybe")
    assert not (tmp_path / "d").exists()
    assert not (tmp_path / "ran").exists()
