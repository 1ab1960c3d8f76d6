"""Efficiency ratios: explicit numerators and denominators, peaks, bus bandwidth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from explain_support import CASES

from rankwatch.errors import ConfigError
from rankwatch.explain import efficiency
from rankwatch.explain.analysis import TraceOptions, efficiency_report


def test_model_flops_from_a_number_or_the_model_shape() -> None:
    assert efficiency.parse_model_flops("3.2e15") == (3.2e15, "given")
    flops, text = efficiency.parse_model_flops("params=7e9,tokens=1e6")
    assert flops == 6 * 7e9 * 1e6 and "6 x 7e+09 params" in text
    flops, _ = efficiency.parse_model_flops("params=1e9,tokens=2e3,layers=4,hidden=8,seq=16")
    assert flops == 6 * 1e9 * 2e3 + 12 * 4 * 8 * 16 * 2e3
    for bad in ("-1", "params=1e9", "tokens=5,x"):
        with pytest.raises(ConfigError):
            efficiency.parse_model_flops(bad)


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA B200", "B200"),
        ("Tesla V100", None),
    ],
)
def test_gpu_names_map_to_the_peak_table(name: str, model: str | None) -> None:
    assert efficiency.gpu_model(name) == model


def test_peak_rates_are_dense_datasheet_figures() -> None:
    assert efficiency.PEAKS["H100 SXM"]["bf16"] == 989.4e12
    assert efficiency.PEAKS["B200"]["fp8"] == 2 * efficiency.PEAKS["B200"]["bf16"]
    rate, text = efficiency.peak_rate(None, None, "NVIDIA H200", "fp8")
    assert rate == 1978.9e12 and "H200 dense fp8" in text
    assert efficiency.peak_rate(None, None, "NVIDIA A100", "fp8")[0] is None
    with pytest.raises(ConfigError, match="unknown GPU"):
        efficiency.peak_rate(None, "V100", None, "bf16")


def test_mfu_is_numerator_over_denominator(analysed) -> None:
    a = analysed("faulty")
    e = efficiency_report(a, TraceOptions(model_flops="2.0e14"))
    mfu = e["mfu"]
    step_s = a.step_stats["median_ns"] / 1e9
    assert mfu["numerator"] == 2.0e14
    assert mfu["denominator"] == pytest.approx(step_s * 4 * 989.4e12)
    assert mfu["value"] == pytest.approx(2.0e14 / (step_s * 4 * 989.4e12))
    assert e["gpus"] == 4 and e["gpus_from"] == "world size in the traces"
    # hardware FLOPs: what the profiler counted per step on the traced ranks, x 4 GPUs
    assert e["hfu"]["numerator"] > 0
    e2 = efficiency_report(a, TraceOptions(model_flops="2.0e14", peak_flops=1e15, world_size=64))
    assert e2["mfu"]["denominator"] == pytest.approx(step_s * 64 * 1e15)


def test_busbw_uses_transfer_time_and_matches_the_simulated_network(analysed) -> None:
    a = analysed("faulty")
    cfg = CASES["faulty"][0]
    [row] = efficiency.bus_bandwidth(a.table, 100.0, None)
    assert row["collective"] == "allreduce" and row["count"] == len(a.table.colls)
    # the simulation transfers at cfg.busbw_gbs plus a 30 us latency per all-reduce
    assert 0.9 * cfg.busbw_gbs < row["busbw_gbs"] <= cfg.busbw_gbs
    assert row["efficiency"] == pytest.approx(row["busbw_gbs"] / 100.0)


def test_busbw_baseline_from_nccl_tests_output(analysed, tmp_path: Path) -> None:
    out = tmp_path / "all_reduce_perf.txt"
    out.write_text(
        "#  Collective test starting: all_reduce_perf\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
        "     1048576        262144     float     sum      -1    50.00   20.97   31.46      0\n"
        "   268435456      67108864     float     sum      -1  2000.00  134.2  201.3      0\n"
    )
    base = efficiency.load_baseline(str(out))
    assert base == {"allreduce": [(1048576.0, 31.46), (268435456.0, 201.3)]}
    js = tmp_path / "base.json"
    js.write_text(json.dumps({"allreduce": [[1048576, 31.46], [268435456, 201.3]]}))
    assert efficiency.load_baseline(str(js)) == base
    [row] = efficiency.bus_bandwidth(analysed("faulty").table, None, base)
    assert row["reference"] == "measured baseline" and 31.46 < row["reference_gbs"] < 201.3


@pytest.mark.parametrize(
    ("family", "n", "factor"),
    [
        ("allreduce", 4, 1.5),
        ("allgather", 4, 0.75),
        ("reducescatter", 8, 0.875),
        ("sendrecv", 2, 1.0),
    ],
)
def test_busbw_factors_follow_nccl_tests(family: str, n: int, factor: float) -> None:
    assert efficiency.busbw_factor(family, n) == factor
