"""The `rankwatch` command line, run as a user runs it (python -m rankwatch)."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rankwatch as package
from helpers import rankwatch
from rankwatch.collect.plugin import plugin_path

SUMMARY = re.compile(
    r"rankwatch: records in (?P<dir>.+): (?P<op>\d+) op-record file\(s\) \((?P<op_lines>\d+) "
    r"lines\), (?P<st>\d+) state file\(s\) \((?P<st_lines>\d+) lines\)"
)


def test_version_option_prints_the_package_version() -> None:
    result = rankwatch("--version")
    assert result.returncode == 0
    assert result.stdout == f"rankwatch {package.__version__}\n"


def test_help_lists_every_subcommand() -> None:
    result = rankwatch("--help")
    assert result.returncode == 0
    for name in ("run", "env", "plugin-path"):
        assert re.search(rf"^\s+{name}\s", result.stdout, flags=re.MULTILINE), name


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = rankwatch("frobnicate")
    assert result.returncode == 2
    assert "No such command 'frobnicate'" in result.stderr


def test_plugin_path_prints_the_existing_plugin() -> None:
    result = rankwatch("plugin-path")
    assert result.returncode == 0
    printed = Path(result.stdout.strip())
    assert printed.is_absolute()
    assert printed.is_file()
    assert printed == plugin_path()


def test_env_output_sets_the_variables_when_evaluated(tmp_path: Path) -> None:
    # Given `rankwatch env` evaluated by bash in a job script
    dump = tmp_path / "dump dir"
    command = f"{sys.executable} -m rankwatch env --dump-dir '{dump}' --gpu-timing off --prom"
    result = subprocess.run(
        ["bash", "-c", f'eval "$({command})" && env'],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    # Then the shell has the plugin's variables, and the dump directory exists
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert seen["NCCL_PROFILER_PLUGIN"] == str(plugin_path())
    assert seen["RANKWATCH_ENABLE"] == "1"
    assert seen["RANKWATCH_DUMP_DIR"] == str(dump)
    assert seen["RANKWATCH_GPU_TIMING"] == "off"
    assert seen["RANKWATCH_PROM"] == "1"
    assert dump.is_dir()


def test_env_without_dump_dir_creates_a_timestamped_one(tmp_path: Path) -> None:
    result = rankwatch("env", cwd=tmp_path)
    assert result.returncode == 0
    (created,) = tmp_path.iterdir()
    assert re.fullmatch(r"rankwatch-\d{8}-\d{6}", created.name)
    assert f"export RANKWATCH_DUMP_DIR={created}\n" in result.stdout


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--gpu-timing", "always"], "Invalid value for '--gpu-timing'"),
        (["--interval-ms", "0"], "Invalid value for '--interval-ms'"),
        (["--min-size", "lots"], "Invalid value for '--min-size'"),
    ],
)
@pytest.mark.parametrize("subcommand", ["env", "run"])
def test_bad_option_values_fail_with_a_clear_message(
    subcommand: str, args: list[str], complaint: str, tmp_path: Path
) -> None:
    result = rankwatch(subcommand, *args, *(["--", "true"] if subcommand == "run" else []))
    assert result.returncode == 2
    assert complaint in result.stderr
    assert result.stdout == ""


def test_run_child_sees_the_plugin_and_dump_dir(tmp_path: Path) -> None:
    # Given a command that records the environment it was started with
    dump = tmp_path / "records"
    script = 'echo "$NCCL_PROFILER_PLUGIN" > seen; echo "$RANKWATCH_DUMP_DIR" >> seen'
    # When it runs under rankwatch
    result = rankwatch("run", "--dump-dir", str(dump), "--", "sh", "-c", script, cwd=tmp_path)
    # Then it saw the plugin path and the dump directory, which exists
    assert result.returncode == 0, result.stderr
    plugin, dump_dir = (tmp_path / "seen").read_text().splitlines()
    assert plugin == str(plugin_path())
    assert dump_dir == str(dump)
    assert dump.is_dir()


def test_run_inherits_the_rest_of_the_environment(tmp_path: Path) -> None:
    env = {**os.environ, "RW_TEST_MARKER": "kept"}
    subprocess.run(
        [sys.executable, "-m", "rankwatch", "run", "--dump-dir", str(tmp_path / "d"),
         "sh", "-c", 'echo "$RW_TEST_MARKER" > seen'],
        env=env, cwd=tmp_path, check=True, capture_output=True,
    )  # fmt: skip
    assert (tmp_path / "seen").read_text() == "kept\n"


def test_run_passes_the_commands_own_options_through_without_dashdash(tmp_path: Path) -> None:
    result = rankwatch("run", "--dump-dir", str(tmp_path), "sh", "-c", "exit 4", "--prom")
    assert result.returncode == 4, result.stderr


@pytest.mark.parametrize("code", [0, 3, 255])
def test_run_exits_with_the_childs_exit_code(code: int, tmp_path: Path) -> None:
    result = rankwatch("run", "--dump-dir", str(tmp_path), "--", "sh", "-c", f"exit {code}")
    assert result.returncode == code


def test_run_reports_a_child_killed_by_a_signal_as_128_plus_signal(tmp_path: Path) -> None:
    result = rankwatch("run", "--dump-dir", str(tmp_path), "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 128 + signal.SIGKILL


def test_run_without_a_command_is_a_usage_error() -> None:
    result = rankwatch("run")
    assert result.returncode == 2
    assert "Missing argument" in result.stderr


def test_run_of_a_missing_program_fails_cleanly(tmp_path: Path) -> None:
    result = rankwatch("run", "--dump-dir", str(tmp_path), "--", "no-such-program-rw")
    assert result.returncode == 2
    assert result.stderr.startswith("rankwatch: error: cmd: cannot run 'no-such-program-rw'")
    assert "Traceback" not in result.stderr


def test_run_without_dump_dir_writes_into_a_timestamped_dir_in_the_cwd(tmp_path: Path) -> None:
    result = rankwatch("run", "true", cwd=tmp_path)
    assert result.returncode == 0
    (created,) = tmp_path.iterdir()
    assert re.fullmatch(r"rankwatch-\d{8}-\d{6}", created.name)
    summary = SUMMARY.search(result.stderr)
    assert summary is not None, result.stderr
    assert summary["dir"] == str(created)


def test_run_counts_the_record_files_and_lines_written(tmp_path: Path) -> None:
    # Given a command that writes what the plugin would: one op file, one state file
    script = (
        'printf "{}\\n{}\\n" > "$RANKWATCH_DUMP_DIR/h-pid1.log";'
        'printf "{}\\n{}\\n{}\\n" > "$RANKWATCH_DUMP_DIR/h-pid1.rwstate.jsonl"'
    )
    result = rankwatch("run", "--dump-dir", str(tmp_path / "d"), "--", "sh", "-c", script)
    summary = SUMMARY.search(result.stderr)
    assert summary is not None, result.stderr
    assert (summary["op"], summary["op_lines"]) == ("1", "2")
    assert (summary["st"], summary["st_lines"]) == ("1", "3")
    assert "no records were written" not in result.stderr


def test_run_warns_when_no_records_were_written(tmp_path: Path) -> None:
    result = rankwatch("run", "--dump-dir", str(tmp_path), "--", "true")
    assert "no records were written" in result.stderr


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_run_forwards_signals_to_the_child(signo: signal.Signals, tmp_path: Path) -> None:
    # Given a child that reports the signal it gets and exits 7
    script = (
        f"trap 'echo got > caught; exit 7' {signo.name[3:]}; touch ready;"
        "i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done"
    )
    # (with the signal's default disposition: a test run started in the background
    # ignores SIGINT, the child would inherit that, and sh cannot trap a signal
    # ignored on entry)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "run", "--dump-dir", str(tmp_path / "d"),
         "--", "sh", "-c", script],
        cwd=tmp_path, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signo, signal.SIG_DFL),
    )  # fmt: skip
    _wait_for(tmp_path / "ready")
    # When rankwatch itself is signalled (as a scheduler or `kill` would)
    proc.send_signal(signo)
    # Then the child got the signal, and rankwatch exits with the child's code
    assert proc.wait(timeout=30) == 7
    assert (tmp_path / "caught").read_text() == "got\n"
    assert SUMMARY.search(proc.stderr.read() if proc.stderr else "")


COUNT_SIGINTS = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[1])
count = 0
def on_sigint(*_):
    global count
    count += 1
signal.signal(signal.SIGINT, on_sigint)
(here / "ready").touch()
end = time.monotonic() + 2.0
while time.monotonic() < end:
    time.sleep(0.01)
(here / "count").write_text(str(count))
"""


def test_run_does_not_repeat_a_terminal_ctrl_c_to_the_child(tmp_path: Path) -> None:
    # Given rankwatch on a terminal, running a child that counts its SIGINTs
    (tmp_path / "child.py").write_text(COUNT_SIGINTS)
    argv = [sys.executable, "-m", "rankwatch", "run", "--dump-dir", str(tmp_path / "d"),
            "--", sys.executable, str(tmp_path / "child.py"), str(tmp_path)]  # fmt: skip
    pid, terminal = pty.fork()
    if pid == 0:  # the child of the fork: become rankwatch on the new terminal
        os.execv(argv[0], argv)
    _wait_for(tmp_path / "ready")
    # When the user presses Ctrl-C three times (the terminal signals both processes)
    for _ in range(3):
        os.write(terminal, b"\x03")
        time.sleep(0.2)
    _drain(terminal)
    # Then the child saw each Ctrl-C once, not again from rankwatch, and exited normally
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert (tmp_path / "count").read_text() == "3"


def _drain(fd: int) -> None:
    # Read the terminal until its other side closes, so the processes never block on it.
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
    os.close(fd)


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
