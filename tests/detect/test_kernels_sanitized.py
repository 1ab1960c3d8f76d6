"""The detectors' kernels (native/rwdetect.c) under AddressSanitizer and UBSan:
random and extreme inputs (indices out of range, NaN and infinite times, int64
limits, empty batches) must neither touch memory outside what they were given nor
hit undefined behaviour, and every call must return a count or a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import build_sanitized, c_compiler, run_sanitized


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler")
def test_kernels_survive_random_and_extreme_inputs_under_sanitizers(tmp_path: Path) -> None:
    binary = tmp_path / "fuzz_rwdetect"
    build_sanitized(binary, ["tests/fuzz_rwdetect.c", "rwdetect.c"])
    for seed in (1, 2, 3):
        run_sanitized(binary, "4000", str(seed))
