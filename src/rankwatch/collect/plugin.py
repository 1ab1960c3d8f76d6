"""Locate the profiler plugin shipped inside the installed package."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from importlib import resources

from rankwatch import __version__
from rankwatch.errors import PluginNotFoundError

PLUGIN_FILENAME = "libnccl-profiler-rankwatch.so"
DRIVER_FILENAME = "rankwatch-fake-nccl"

_REBUILD_HINT = (
    "the package was installed without its compiled plugin; rebuild it with "
    "`pip install --force-reinstall --no-deps <path to the rankwatch source>` "
    "(needs a C compiler and CMake >= 3.18)"
)


def plugin_path() -> pathlib.Path:
    """Absolute path of the installed libnccl-profiler-rankwatch.so.

    NCCL_PROFILER_PLUGIN accepts this full path, so the plugin never has to be
    on LD_LIBRARY_PATH. Raises PluginNotFoundError if the build did not install it.
    """
    return _installed(PLUGIN_FILENAME, "profiler plugin")


def driver_path() -> pathlib.Path:
    """Absolute path of the fake NCCL driver built with the plugin (for the demo)."""
    return _installed(DRIVER_FILENAME, "fake NCCL driver")


def _installed(filename: str, what: str) -> pathlib.Path:
    expected = _packaged_path(filename)
    for candidate in (expected, *_recorded_paths(filename)):
        if candidate.is_file():
            return candidate.resolve()
    raise PluginNotFoundError(f"{what} not found: {_REBUILD_HINT}", file=expected)


def _packaged_path(filename: str) -> pathlib.Path:
    # A wheel is installed unpacked, so the resource is a real file on disk;
    # anything else (a zip import) could not be dlopen'ed by NCCL anyway.
    return pathlib.Path(str(resources.files("rankwatch").joinpath("_lib", filename)))


def _recorded_paths(filename: str) -> Iterator[pathlib.Path]:
    # Editable installs import the Python sources from the checkout while CMake
    # installs the plugin into site-packages; the distribution's RECORD says
    # where. Imported lazily: a regular install never needs it.
    from importlib import metadata

    try:
        dist = metadata.distribution("rankwatch")
    except metadata.PackageNotFoundError:
        return
    if dist.version != __version__:
        return  # another rankwatch is installed; its plugin is not ours
    for file in dist.files or ():
        if file.name == filename:
            yield pathlib.Path(str(file.locate()))
