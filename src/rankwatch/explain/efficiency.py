"""Efficiency ratios with their numerators and denominators spelled out.

MFU  = model FLOPs per step / (step time x GPUs x peak FLOP/s per GPU)
HFU  = hardware FLOPs per step / (step time x GPUs x peak FLOP/s per GPU)
       (hardware FLOPs include recomputation; from --hardware-flops, else the FLOPs
       the profiler counted (with_flops=True) on the traced ranks, scaled to all GPUs)
busbw efficiency = transfer-only bus bandwidth / reference bus bandwidth
       busbw = bytes / transfer time x factor (nccl-tests: 2(n-1)/n for all-reduce,
       (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 otherwise); the
       transfer time excludes waiting for peers (collectives._split), since a
       wait-inflated time would blame the network for a slow rank.

Peak rates are dense (no 2:4 sparsity) Tensor Core figures per GPU.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rankwatch.errors import ConfigError
from rankwatch.explain.collectives import CollectiveTable
from rankwatch.explain.peaks import PEAKS

GB = 1e9


def gpu_model(name: str | None) -> str | None:
    """The PEAKS entry for a GPU name as drivers report it ("NVIDIA H100 80GB HBM3")."""
    if not name:
        return None
    low = name.lower()
    if "h200" in low:
        return "H200"
    if "h100" in low:
        return "H100 PCIe" if "pcie" in low else "H100 SXM"
    if "a100" in low:
        return "A100"
    if "b200" in low:
        return "B200"
    return None


@dataclass
class Ratio:
    """numerator / denominator = value, with the words for each."""

    name: str
    numerator: float
    numerator_text: str
    denominator: float
    denominator_text: str

    @property
    def value(self) -> float:
        return self.numerator / self.denominator if self.denominator else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "numerator": self.numerator,
            "numerator_text": self.numerator_text,
            "denominator": self.denominator,
            "denominator_text": self.denominator_text,
            "value": self.value,
        }


def parse_model_flops(text: str) -> tuple[float, str]:
    """FLOPs per step from a number ("3.2e15") or from the model's shape:
    "params=7e9,tokens=1048576[,layers=32,hidden=4096,seq=4096]" gives
    6 N T (+ 12 L h s T attention, PaLM's per-token count) for one training step
    (forward + backward) over T tokens."""
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value <= 0:
            raise ConfigError("must be positive", field="--model-flops")
        return value, "given"
    parts: dict[str, float] = {}
    for item in text.split(","):
        key, sep, val = item.partition("=")
        try:
            parts[key.strip().lower()] = float(val)
        except ValueError:
            sep = ""
        if not sep:
            raise ConfigError(
                f"{item!r}: expected a number or key=value pairs (params, tokens, layers, "
                "hidden, seq)",
                field="--model-flops",
            ) from None
    if "params" not in parts or "tokens" not in parts:
        raise ConfigError("needs params= and tokens= (or one number)", field="--model-flops")
    n, t = parts["params"], parts["tokens"]
    flops, formula = 6 * n * t, f"6 x {n:.4g} params x {t:.4g} tokens"
    if {"layers", "hidden", "seq"} <= parts.keys():
        attn = 12 * parts["layers"] * parts["hidden"] * parts["seq"] * t
        flops += attn
        formula += (
            f" + 12 x {parts['layers']:g} layers x {parts['hidden']:g} hidden x "
            f"{parts['seq']:g} seq x {t:.4g} tokens"
        )
    return flops, formula


def peak_rate(
    peak: float | None, gpu: str | None, trace_gpu: str | None, dtype: str
) -> tuple[float | None, str]:
    """(peak FLOP/s per GPU, how it was decided) or (None, why not)."""
    if peak:
        return peak, "given (--peak-flops)"
    model = gpu_model(gpu) if gpu else gpu_model(trace_gpu)
    if gpu and model is None:
        raise ConfigError(f"unknown GPU {gpu!r}; known: {', '.join(PEAKS)}", field="--gpu")
    if model is None and trace_gpu is None:
        return None, "the traces name no GPU; give --peak-flops or --gpu"
    if model is None:
        return None, f"GPU {trace_gpu} is not in the peak table; give --peak-flops or --gpu"
    rate = PEAKS[model].get(dtype)
    if rate is None:
        return None, f"{model} has no {dtype} Tensor Core rate; give --peak-flops"
    return rate, f"{model} dense {dtype} ({'--gpu' if gpu else 'GPU named in the trace'})"


def utilisation(
    name: str, flops: float, flops_text: str, step_s: float, gpus: int, peak: float, peak_text: str
) -> Ratio:
    return Ratio(
        name,
        flops,
        f"{flops_text} FLOPs per step",
        step_s * gpus * peak,
        f"{step_s:.4f} s step x {gpus} GPUs x {peak:.4g} FLOP/s ({peak_text})",
    )


def busbw_factor(family: str, n: int) -> float:
    if n < 2:
        return 1.0
    if family == "allreduce":
        return 2 * (n - 1) / n
    if family in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def size_class(nbytes: int) -> str:
    """Power-of-4 size buckets: 1 MiB-4 MiB and so on."""
    if nbytes <= 0:
        return "0 B"
    low = 4 ** int(math.log(nbytes, 4))
    return f"{_human(low)}-{_human(low * 4)}"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} PiB"


_NCCL_TESTS_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
)
_NCCL_TESTS_OP = re.compile(
    r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv)"
)


def load_baseline(path: str) -> dict[str, list[tuple[float, float]]]:
    """Measured busbw per collective: nccl-tests output (out-of-place columns; the
    collective from its header or the file name) or JSON {"allreduce": [[bytes, GB/s]]}."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        return {k: sorted((float(b), float(v)) for b, v in pts) for k, pts in data.items()}
    op = _NCCL_TESTS_OP.search(text) or _NCCL_TESTS_OP.search(Path(path).name)
    if op is None:
        raise ConfigError(
            "cannot tell which collective this nccl-tests output measured",
            file=path,
            field="--busbw-baseline",
        )
    from rankwatch.explain.events import family

    rows = [
        (float(m.group(1)), float(m.group(5)))
        for m in map(_NCCL_TESTS_ROW.match, text.splitlines())
        if m
    ]
    if not rows:
        raise ConfigError("no nccl-tests result rows", file=path, field="--busbw-baseline")
    return {family(op.group(1)): sorted(rows)}


def _baseline_at(points: list[tuple[float, float]], nbytes: float) -> float | None:
    """Baseline busbw at a size, interpolated in log(size)."""
    if not points:
        return None
    sizes = np.log([max(p[0], 1.0) for p in points])
    return float(np.interp(math.log(max(nbytes, 1.0)), sizes, [p[1] for p in points]))


def bus_bandwidth(
    table: CollectiveTable, peak_gbs: float | None, baseline: dict[str, list] | None
) -> list[dict[str, Any]]:
    """Transfer-only busbw per collective and size class, against the reference."""
    groups: dict[tuple[str, str], list[tuple[int, int, float]]] = defaultdict(list)
    for c in table.colls:
        nbytes = c.meta.nbytes()
        if c.transfer_ns is None or not nbytes or c.transfer_ns <= 0:
            continue
        n = c.meta.group_size or len(c.expected) or len(c.ops)
        bw = nbytes / (c.transfer_ns / 1e9) * busbw_factor(c.meta.family, n) / GB
        groups[(c.meta.family, size_class(nbytes))].append((nbytes, c.transfer_ns, bw))
    rows = []
    for (fam, cls), vals in sorted(groups.items()):
        size = float(np.median([v[0] for v in vals]))
        bw = float(np.median([v[2] for v in vals]))
        ref, ref_text = peak_gbs, "given peak (--busbw-peak)"
        if baseline and fam in baseline:
            ref, ref_text = _baseline_at(baseline[fam], size), "measured baseline"
        rows.append(
            {
                "collective": fam,
                "size_class": cls,
                "count": len(vals),
                "bytes": int(size),
                "transfer_ns": int(np.median([v[1] for v in vals])),
                "busbw_gbs": bw,
                "reference_gbs": ref,
                "reference": ref_text if ref else None,
                "efficiency": None if not ref else bw / ref,
            }
        )
    return rows
