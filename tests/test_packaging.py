"""The installed package carries a self-contained plugin that NCCL can load.

The plugin is loaded into NCCL's own process, so it must not drag in a second
libnccl, libcudart or a C++ runtime, and must expose nothing but the versioned
profiler tables NCCL looks up with dlsym.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys

import pytest

import rankwatch
from helpers import REPO_ROOT
from rankwatch.collect.plugin import PLUGIN_FILENAME, plugin_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ALLOWED_NEEDED = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
}
REQUIRED_EXPORTS = {"ncclProfiler_v5", "ncclProfiler_v6"}
OPTIONAL_EXPORTS = {"ncclProfiler_v4"}
# Symbols some linkers define in every shared object; not part of our interface.
LINKER_SYMBOLS = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def _tool_output(*cmd: str) -> str:
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is required for this test (Debian package binutils)")
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _needed_libraries() -> set[str]:
    dynamic = _tool_output("readelf", "-d", str(plugin_path()))
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))


def _exported_symbols() -> set[str]:
    names = set()
    for line in _tool_output("nm", "-D", "--defined-only", str(plugin_path())).splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, name = parts[-2], parts[-1]
        # Type A marks version-node names from a version script, not code or data.
        if kind != "A" and name.split("@")[0] not in LINKER_SYMBOLS:
            names.add(name.split("@")[0])
    return names


def test_plugin_is_installed_inside_the_package() -> None:
    # Given the installed package / When the plugin is located
    path = plugin_path()
    # Then it is a real file at rankwatch/_lib/<name>
    assert path.is_file()
    assert path.name == PLUGIN_FILENAME
    assert path.parent.name == "_lib"
    assert path.parent.parent.name == "rankwatch"


def test_plugin_needs_only_the_c_runtime() -> None:
    # When the dynamic section of the plugin is read
    needed = _needed_libraries()
    # Then every NEEDED library is part of the C runtime
    assert needed <= ALLOWED_NEEDED, f"unexpected NEEDED entries: {needed - ALLOWED_NEEDED}"


def test_plugin_links_neither_nccl_nor_cuda_nor_cxx() -> None:
    needed = _needed_libraries()
    forbidden = [lib for lib in needed if re.match(r"lib(nccl|cudart|cuda|stdc\+\+)\.", lib)]
    assert forbidden == []


def test_plugin_exports_only_the_profiler_tables() -> None:
    # When the defined dynamic symbols are listed
    exported = _exported_symbols()
    # Then they are the v5 and v6 tables, plus optionally v4, and nothing else
    assert exported >= REQUIRED_EXPORTS, f"missing: {REQUIRED_EXPORTS - exported}"
    assert exported - REQUIRED_EXPORTS - OPTIONAL_EXPORTS == set()


def test_plugin_is_stamped_with_the_package_version() -> None:
    # The plugin writes its version into every record (metadata.git_rev,
    # comm.plugin_version), so the string must be in the binary.
    assert rankwatch.__version__.encode() in plugin_path().read_bytes()


def test_versions_agree_across_pyproject_cmake_and_package() -> None:
    # Given the version in its three written places and the installed metadata
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project_version = pyproject["project"]["version"]
    cmake_version = pyproject["tool"]["scikit-build"]["cmake"]["define"]["RANKWATCH_VERSION"]
    # Then they are all the same
    assert cmake_version == project_version
    assert rankwatch.__version__ == project_version
    assert importlib.metadata.version("rankwatch") == project_version


def test_wheel_is_tagged_for_any_python_version() -> None:
    # The plugin is not a CPython extension: one py3-none-<platform> wheel fits all.
    wheel = importlib.metadata.distribution("rankwatch").read_text("WHEEL") or ""
    tags = re.findall(r"^Tag: (\S+)$", wheel, flags=re.MULTILINE)
    assert tags, wheel
    assert all(tag.startswith("py3-none-") and not tag.endswith("-any") for tag in tags)


def test_the_compiled_helpers_are_installed_and_load() -> None:
    # The op-record reader and the alignment's and detectors' kernels have
    # pure-Python fallbacks, so a build that lost them would pass every other
    # test, only slower.
    from rankwatch.align import kernels as align_kernels
    from rankwatch.detect import kernels
    from rankwatch.store import native

    assert native.available(), "librankwatch-rwparse missing from the installation"
    assert kernels.library() is not None, "librankwatch-rwdetect missing from the installation"
    assert align_kernels.library() is not None, "librankwatch-rwalign missing from the installation"
