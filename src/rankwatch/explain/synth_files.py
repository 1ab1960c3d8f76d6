"""`generate(cfg, out_dir, variant)`: simulate a job (synth) and write one trace file
per rank in a Kineto variant (synth_kineto.VARIANTS) or as Nsight SQLite ("nsys",
"nsys_old"). Steps are written as they are simulated, so the files can be far
larger than memory. Returns the ground truth (plain data)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rankwatch.explain.synth import Simulation, SynthConfig
from rankwatch.explain.synth_kineto import VARIANTS, KinetoWriter
from rankwatch.explain.synth_nsys import NsysWriter

NSYS_VARIANTS = ("nsys", "nsys_old")


def generate(
    cfg: SynthConfig, out_dir: str | os.PathLike[str], variant: str = "v2_11"
) -> dict[str, Any]:
    """Write the traces of `cfg` into out_dir; return the ground truth."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if variant == "cpu" and cfg.mode != "cpu":
        raise ValueError("variant 'cpu' needs SynthConfig(mode='cpu')")
    if variant in NSYS_VARIANTS:
        writers: list[Any] = [NsysWriter(out, cfg, r, variant) for r in range(cfg.ranks)]
    elif variant in VARIANTS:
        writers = [KinetoWriter(out, cfg, r, VARIANTS[variant]) for r in range(cfg.ranks)]
    else:
        raise ValueError(f"unknown variant {variant!r}: {sorted(VARIANTS) + list(NSYS_VARIANTS)}")
    sim = Simulation(cfg)
    for _ in range(cfg.steps):
        for writer, events in zip(writers, sim.step(), strict=True):
            writer.write(events)
    files = [str(w.close()) for w in writers]
    truth = sim.truth
    truth["files"] = files
    truth["variant"] = variant
    truth["offsets_ns"] = [cfg.offset_ns(r) for r in range(cfg.ranks)]
    truth["hosts"] = [cfg.host_of(r) for r in range(cfg.ranks)]
    return truth
