"""rankwatch.collect.plugin: finding the plugin inside the installed package."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

import rankwatch
from rankwatch.collect.plugin import PLUGIN_FILENAME, plugin_path
from rankwatch.errors import PluginNotFoundError


def test_plugin_path_is_absolute_and_exists() -> None:
    path = plugin_path()
    assert path.is_absolute()
    assert path.is_file()


def test_plugin_path_is_the_file_the_installed_distribution_recorded() -> None:
    # Holds for regular and editable installs alike (an editable install keeps
    # the Python sources in the checkout and the plugin in site-packages).
    recorded = [
        Path(str(file.locate())).resolve()
        for file in importlib.metadata.distribution("rankwatch").files or ()
        if file.name == PLUGIN_FILENAME
    ]
    assert recorded == [plugin_path()]


def test_package_without_plugin_fails_with_a_rebuild_hint(tmp_path: Path) -> None:
    # Given a copy of the package whose build left no plugin behind, run without
    # site-packages (-S) so no installed rankwatch can stand in for it
    package_dir = Path(rankwatch.__file__).resolve().parent
    shutil.copytree(package_dir, tmp_path / "rankwatch", ignore=shutil.ignore_patterns("_lib"))
    shutil.copytree(Path(click.__file__).parent, tmp_path / "click")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # When the CLI is asked for the plugin path
    result = subprocess.run(
        [sys.executable, "-S", "-m", "rankwatch", "plugin-path"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    # Then it fails with the plugin-not-found exit code and says how to rebuild
    assert result.returncode == PluginNotFoundError.exit_code
    assert "profiler plugin not found" in result.stderr
    assert "pip install" in result.stderr
    assert result.stdout == ""
