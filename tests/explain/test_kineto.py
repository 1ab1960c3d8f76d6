"""Reading PyTorch Profiler (Kineto) traces across their schema variants, streaming."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from explain_support import CASES, KINETO_VARIANTS

from rankwatch.explain.events import Kind
from rankwatch.explain.jsonstream import JsonStreamError, scan
from rankwatch.explain.kineto import read_kineto
from rankwatch.explain.load import find_trace_files, load


def _files(path: Path) -> list[str]:
    return find_trace_files([path])


@pytest.mark.parametrize("variant", KINETO_VARIANTS)
def test_every_variant_gives_every_rank_step_and_collective(traces, variant: str) -> None:
    path, truth = traces(variant)
    cfg, _ = CASES[variant]
    loaded = load([path], jobs=1)
    assert loaded.problems == []
    assert [t.rank for t in loaded.traces] == list(range(cfg.ranks))
    colls_per_rank = len(truth["collectives"])
    for t in loaded.traces:
        assert [s.number for s in t.steps] == list(
            range(cfg.first_step, cfg.first_step + cfg.steps)
        )
        assert len(t.select(Kind.COMM_KERNEL)) == colls_per_rank
        assert len(t.select(Kind.INPUT)) == cfg.steps
        # step wall times as simulated (v1_13 writes whole microseconds)
        tol = 1_000 if variant == "v1_13" else 1
        for s in t.steps:
            assert abs((s.end - s.start) - truth["steps"][str(s.number)][str(t.rank)]) <= tol


@pytest.mark.parametrize(
    ("variant", "seq", "pg", "source", "prefix"),
    [
        ("v2_11", True, True, "kernel args", "ncclDevKernel"),
        ("v2_4", False, True, "kernel args", "ncclDevKernel"),
        ("v2_1", False, False, "cpu op", "ncclKernel"),
    ],
)
def test_collective_args_are_read_where_the_variant_has_them(
    traces, variant: str, seq: bool, pg: bool, source: str, prefix: str
) -> None:
    path, _ = traces(variant)
    t = load([path], jobs=1).traces[0]
    metas = [t.colls[i] for i in t.meta[t.meta >= 0]]
    kernel_meta = [m for m in metas if m.source == source]
    assert kernel_meta, f"no metadata from {source}"
    m = kernel_meta[0]
    assert m.family == "allreduce" and m.dtype == "BFloat16" and m.in_nelems > 0
    assert (m.seq is not None) == seq
    assert (m.pg == "0") == pg
    assert list(t.schema["nccl_kernel_prefixes"]) == [prefix]


def test_oldest_variant_has_no_args_and_absolute_microseconds(traces) -> None:
    path, _ = traces("v1_13")
    t = load([path], jobs=1).traces[0]
    assert t.schema["time_base"] == "absolute microseconds"
    assert t.schema["distributedInfo"] == "missing"
    assert t.rank_source == "file name"
    assert t.schema["collective_args"] == []
    assert not (t.meta >= 0).any()


def test_relative_and_absolute_time_bases_give_the_same_clock(traces) -> None:
    """v2_11 (ts relative to baseTimeNanoseconds) and v1_13 (absolute us) of one job."""
    new = load([traces("v2_11")[0]], jobs=1).traces
    old = load([traces("v1_13")[0]], jobs=1).traces
    for a, b in zip(new, old, strict=True):
        starts_a = np.array([s.start for s in a.steps])
        starts_b = np.array([s.start for s in b.steps])
        assert np.abs(starts_a - starts_b).max() < 1_000


def test_gzip_and_plain_give_identical_tables(traces, tmp_path: Path) -> None:
    path, _ = traces("v2_4")  # written gzipped
    gz = _files(path)[0]
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_bytes(gzip.decompress(Path(gz).read_bytes()))
    a, b = read_kineto(gz), read_kineto(plain)
    for col in ("kind", "name", "start", "end", "corr", "ext", "meta"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


def test_tiny_chunks_give_the_same_events_as_big_ones(traces) -> None:
    """The streaming scanner is exact whatever the chunk boundaries cut through."""
    path, _ = traces("v2_11")
    f = _files(path)[0]
    a, b = read_kineto(f), read_kineto(f, chunk=997)
    for col in ("kind", "name", "start", "end", "track", "corr", "ext", "meta", "flops"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert [s.number for s in a.steps] == [s.number for s in b.steps]
    assert b.names == a.names


def test_cpu_only_trace_has_host_collectives_and_no_gpu(traces) -> None:
    path, truth = traces("cpu")
    t = load([path], jobs=1).traces[0]
    assert not t.has_gpu
    assert len(t.select(Kind.COMM_HOST)) == len(truth["collectives"])


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op", **args: object) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def test_names_that_look_like_event_boundaries_are_read_exactly(tmp_path: Path) -> None:
    """'},' inside strings and nested objects make the bulk cut fail; the element-wise
    fallback must still read every event."""
    events = [_event('weird "},{" name }, {', 10.0, 1.0, nested={"a": [{"b": 1}, {"c": "},"}]})]
    events += [_event(f"aten::op{i}", 20.0 + i, 0.5) for i in range(50)]
    events.append(_event("ProfilerStep#3", 5.0, 100.0, cat="user_annotation"))
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}, indent=1))
    for chunk in (7, 64, 1 << 20):
        t = read_kineto(f, chunk=chunk)
        assert len(t.kind) == 51
        assert 'weird "},{" name }, {' in t.names
        assert [s.number for s in t.steps] == [3]
        assert t.steps[0].start == 10**18 + 5_000


def test_bare_event_array_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "rank2.json"
    f.write_text(json.dumps([_event("aten::mm", 1.0, 2.0), _event("ProfilerStep#1", 0, 9.0)]))
    t = read_kineto(f)
    assert t.rank == 2 and t.rank_source == "file name"
    assert len(t.kind) == 1 and t.steps[0].number == 1


def _scan_all(text: str, chunk: int = 5) -> list:
    pos = [0]

    def read(n: int) -> str:
        out = text[pos[0] : pos[0] + n]
        pos[0] += n
        return out

    return list(scan(read, chunk=chunk))


def test_scanner_yields_keys_before_and_after_the_array() -> None:
    text = '{"a": 1, "traceEvents": [{"x": 1}, {"x": 2}], "b": [1, 2], "c": 12345678}'
    got = _scan_all(text)
    assert got[0] == ("a", 1)
    assert [e for k, batch in got if k == "traceEvents" for e in batch] == [{"x": 1}, {"x": 2}]
    assert ("b", [1, 2]) in got and ("c", 12345678) in got  # number not cut at a chunk end


def test_scanner_reports_truncation_with_its_line() -> None:
    text = '{\n"traceEvents": [\n{"x": 1},\n{"x": 2},\n{"x": '
    with pytest.raises(JsonStreamError) as exc:
        _scan_all(text)
    assert exc.value.truncated
    assert exc.value.line == 5


def test_scanner_reports_malformed_json_with_its_line() -> None:
    text = '{\n"traceEvents": [\n{"x": 1},\n{"x": oops},\n{"x": 3}\n]}'
    with pytest.raises(JsonStreamError) as exc:
        _scan_all(text, chunk=1 << 10)
    assert not exc.value.truncated
    assert exc.value.line == 4
