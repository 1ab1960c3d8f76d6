"""Reading Nsight Systems SQLite exports, including older schemas and missing tables."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from explain_support import CASES, NSYS_VARIANTS

from rankwatch.errors import RecordError
from rankwatch.explain.events import Kind
from rankwatch.explain.load import find_trace_files, load
from rankwatch.explain.nsys import read_nsys


@pytest.mark.parametrize("variant", NSYS_VARIANTS)
def test_nsys_exports_give_steps_kernels_and_launches(traces, variant: str) -> None:
    path, truth = traces(variant)
    cfg, _ = CASES[variant]
    loaded = load([path], jobs=1)
    assert loaded.problems == []
    assert [t.rank for t in loaded.traces] == [0, 1]
    for t in loaded.traces:
        assert t.fmt == "nsys" and t.gpu_name == "NVIDIA H200" and t.host == f"node{t.rank:02d}"
        assert [s.number for s in t.steps] == list(
            range(cfg.first_step, cfg.first_step + cfg.steps)
        )
        for s in t.steps:
            assert s.end - s.start == truth["steps"][str(s.number)][str(t.rank)]
        assert len(t.select(Kind.COMM_KERNEL)) == len(truth["collectives"])
        kernels = t.select(Kind.KERNEL)
        assert (t.corr[kernels] > 0).all()
        assert len(t.select(Kind.RUNTIME)) > len(kernels)


def test_recent_export_has_nccl_ranges_with_payload_and_a_time_base(traces) -> None:
    path, truth = traces("nsys")
    t = load([path], jobs=1).traces[0]
    nccl = t.select(Kind.COMM_CPU)
    assert len(nccl) == len(truth["collectives"])
    meta = t.colls[int(t.meta[nccl[0]])]
    assert meta.family == "allreduce" and meta.source == "nvtx"
    assert meta.pg is not None and meta.size_bytes and meta.size_bytes > 0
    assert t.start.min() > 1_700_000_000 * 10**9  # absolute Unix time
    assert len(t.select(Kind.MEMCPY)) > 0


def test_old_export_is_session_relative_without_nccl_ranges(traces) -> None:
    path, _ = traces("nsys_old")
    t = load([path], jobs=1).traces[0]
    assert "session-relative" in t.schema["time_base"]
    assert len(t.select(Kind.COMM_CPU)) == 0
    assert len(t.select(Kind.INPUT)) == CASES["nsys_old"][0].steps


def _copy(traces, tmp_path: Path) -> Path:
    path, _ = traces("nsys")
    src = sorted(find_trace_files([path]))[0]
    return Path(shutil.copy(src, tmp_path / "rank0.sqlite"))


def _drop(path: Path, *tables: str) -> None:
    con = sqlite3.connect(path)
    for t in tables:
        con.execute(f"DROP TABLE {t}")
    con.commit()
    con.close()


def test_missing_tables_only_remove_what_they_held(traces, tmp_path: Path) -> None:
    f = _copy(traces, tmp_path)
    _drop(f, "NVTX_EVENTS", "ENUM_NSYS_EVENT_TYPE", "TARGET_INFO_GPU")
    t = read_nsys(f)
    assert t.steps == [] and t.gpu_name is None
    assert len(t.select(Kind.KERNEL)) > 0


def test_missing_columns_are_tolerated(traces, tmp_path: Path) -> None:
    """Rebuild the kernel table with only start/end/shortName (an old, lean schema)."""
    f = _copy(traces, tmp_path)
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE k2 AS SELECT start, end, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("ALTER TABLE k2 RENAME TO CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.close()
    t = read_nsys(f)
    kernels = t.select(Kind.KERNEL, Kind.COMM_KERNEL)
    assert len(kernels) > 0 and (t.corr[kernels] == -1).all()
    assert len(t.select(Kind.COMM_KERNEL)) > 0  # names still resolve through StringIds


def test_export_without_cuda_or_nvtx_is_refused(traces, tmp_path: Path) -> None:
    f = _copy(traces, tmp_path)
    _drop(f, "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(RecordError, match="not an Nsight Systems export"):
        read_nsys(f)
