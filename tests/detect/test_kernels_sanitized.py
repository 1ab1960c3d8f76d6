"""The detectors' kernels (native/rwdetect.c) under AddressSanitizer and UBSan:
random and extreme inputs (indices out of range, NaN and infinite times, int64
limits, empty batches) must neither touch memory outside what they were given nor
hit undefined behaviour, and every call must return a count or a refusal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import NATIVE_DIR, c_compiler


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler")
def test_kernels_survive_random_and_extreme_inputs_under_sanitizers(tmp_path: Path) -> None:
    cc = c_compiler()
    assert cc is not None
    binary = tmp_path / "fuzz_rwdetect"
    build = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", f"-I{NATIVE_DIR}", "-o", str(binary),
         str(NATIVE_DIR / "tests" / "fuzz_rwdetect.c"), str(NATIVE_DIR / "rwdetect.c"), "-lm"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"sanitizer runtime not available: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    for seed in (1, 2, 3):
        done = subprocess.run(
            [str(binary), "4000", str(seed)],
            capture_output=True, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("ok:"), done.stdout
