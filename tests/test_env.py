"""rankwatch.collect.env: the variables that enable the plugin, and their shell form."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path

import pytest

from rankwatch.collect.env import (
    default_dump_dir,
    plugin_env,
    prepare_dump_dir,
    resolve_dump_dir,
    shell_exports,
)
from rankwatch.collect.plugin import plugin_path
from rankwatch.errors import ConfigError


def test_minimal_env_enables_the_plugin_and_names_the_dump_dir(tmp_path: Path) -> None:
    env = plugin_env(tmp_path)
    assert env == {
        "NCCL_PROFILER_PLUGIN": str(plugin_path()),
        "RANKWATCH_ENABLE": "1",
        "RANKWATCH_DUMP_DIR": str(tmp_path),
    }


def test_every_option_maps_to_its_variable(tmp_path: Path) -> None:
    env = plugin_env(
        tmp_path, interval_ms=250, gpu_timing="sampled", min_size=0, prom=True, job_id="j 7"
    )
    assert env["RANKWATCH_INTERVAL_MS"] == "250"
    assert env["RANKWATCH_GPU_TIMING"] == "sampled"
    assert env["RANKWATCH_MIN_SIZE_BYTES"] == "0"
    assert env["RANKWATCH_PROM"] == "1"
    assert env["RANKWATCH_JOB_ID"] == "j 7"


def test_unset_options_leave_the_plugin_defaults_alone(tmp_path: Path) -> None:
    env = plugin_env(tmp_path, prom=False, job_id="")
    assert not any(key in env for key in ("RANKWATCH_PROM", "RANKWATCH_JOB_ID"))


def test_relative_dump_dir_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ranks may change directory before NCCL starts, so the path must not be relative.
    monkeypatch.chdir(tmp_path)
    assert plugin_env("out")["RANKWATCH_DUMP_DIR"] == str(tmp_path / "out")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("gpu_timing", "sometimes"),
        ("interval_ms", 0),
        ("interval_ms", True),
        ("min_size", -1),
        ("min_size", 1.5),
    ],
)
def test_invalid_settings_raise_config_error_naming_the_option(
    tmp_path: Path, option: str, value: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        plugin_env(tmp_path, **{option: value})  # type: ignore[arg-type]
    assert caught.value.field == option
    assert repr(value) in str(caught.value)


def test_shell_exports_survive_eval_with_awkward_values() -> None:
    # Given values with spaces, quotes, dollars and a newline
    env = {"RW_A": "two words", "RW_B": "it's $HOME", "RW_C": 'q"x\ny', "RW_D": ""}
    # When bash evaluates the exports and prints them back
    script = 'eval "$1"; printf "%s\\0" "$RW_A" "$RW_B" "$RW_C" "$RW_D"'
    out = subprocess.run(
        ["bash", "-c", script, "bash", shell_exports(env)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # Then every value comes back unchanged
    assert out.split("\0")[:-1] == list(env.values())


def test_shell_exports_are_one_export_line_per_variable() -> None:
    text = shell_exports({"A": "1", "B": "x y"})
    assert text == "export A=1\nexport B='x y'\n"


def test_default_dump_dir_is_named_after_utc_time_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert default_dump_dir(when) == tmp_path / "rankwatch-20260102-030405"


def test_resolve_dump_dir_makes_the_given_dir_absolute_or_picks_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_dump_dir("x") == tmp_path / "x"
    assert resolve_dump_dir(None).parent == tmp_path
    assert resolve_dump_dir(None).name.startswith("rankwatch-")


def test_prepare_dump_dir_creates_missing_parents(tmp_path: Path) -> None:
    made = prepare_dump_dir(tmp_path / "a" / "b")
    assert made.is_dir()
    assert made == tmp_path / "a" / "b"


def test_prepare_dump_dir_reports_what_is_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot create dump directory") as caught:
        prepare_dump_dir(tmp_path / "file" / "sub")
    assert caught.value.file == os.fspath(tmp_path / "file" / "sub")
