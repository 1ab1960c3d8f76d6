"""rankwatch's analysis on records the plugin wrote on real GPUs.

tests/fixtures/h200x2/ holds the records of bench/gpu/train_lm.py runs on 2 NVIDIA
H200 (PyTorch 2.11, NCCL 2.28.9), gzipped, with each run's ground truth written by
the job itself (job/truth-rank*.json: the injected fault; job/steps-rank*.jsonl: when
every step ran; job/issued-rank*.json: what PyTorch's Flight Recorder says it
issued), and a JAX run. See docs/validation.md.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from rankwatch.cli.analyze import analyze

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "h200x2"

# PyTorch's Flight Recorder names -> NCCL function names in the records
TORCH_TO_NCCL = {
    "nccl:all_reduce": "AllReduce",
    "nccl:broadcast": "Broadcast",
    "nccl:all_gather": "AllGather",
    "nccl:_all_gather_base": "AllGather",
    "nccl:all_gather_into_tensor": "AllGather",
    "nccl:_reduce_scatter_base": "ReduceScatter",
    "nccl:reduce_scatter_tensor": "ReduceScatter",
}


def _truth(run: Path) -> dict:
    return json.loads((run / "job" / "truth-rank0.json").read_text())


def _steps(run: Path, rank: int) -> list[dict]:
    path = run / "job" / f"steps-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _step_at(run: Path, rank: int, ns: int) -> int | None:
    """The step whose time span holds ns on that rank, else the next one to start."""
    steps = _steps(run, rank)
    for s in steps:
        if s["start_ns"] <= ns <= s["end_ns"]:
            return s["step"]
    later = [s["step"] for s in steps if s["start_ns"] > ns]
    return min(later) if later else None


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict]:
    return {
        run.name: analyze((run / "dump",), store=None, quiet=True)
        for run in sorted(RUNS.iterdir())
        if (run / "dump").is_dir()
    }


def test_every_run_is_read_whole(summaries):
    for name, s in summaries.items():
        assert not s["problems"], (name, s["problems"])
        assert s["job"]["op_records"] > 0, name


@pytest.mark.parametrize("name", ["ddp-gpu", "ddp-host", "fsdp-gpu"])
def test_injected_straggler_found_with_rank_cause_and_onset(summaries, name):
    truth = _truth(RUNS / name)
    found = [f for f in summaries[name]["findings"] if f["kind"] == "straggler"]
    assert len(found) == 1, found
    f = found[0]
    assert f["rank"] == truth["fault_rank"]
    assert f["cause"] == truth["fault"]
    assert _step_at(RUNS / name, f["rank"], f["since"]["ns"]) == truth["fault_step"]
    assert f["cost_s"] > 0


def test_healthy_run_has_no_finding(summaries):
    assert summaries["ddp-healthy"]["findings"] == []


def test_hang_names_the_rank_that_never_enqueued(summaries):
    truth = _truth(RUNS / "ddp-hang")
    hangs = [f for f in summaries["ddp-hang"]["findings"] if f["kind"] == "hang"]
    assert [(f["rank"], f["cause"]) for f in hangs] == [(truth["fault_rank"], "not_enqueued")]
    # the op it never enqueued is the first collective of the step it hung in
    rank0_steps = _steps(RUNS / "ddp-hang", 0)
    assert len(rank0_steps) == truth["fault_step"]
    assert [f for f in summaries["ddp-hang"]["findings"] if f["kind"] != "hang"] == []


def _record_counts(run: Path) -> Counter:
    files = sorted((run / "dump").glob("*.log.gz"))
    counts: Counter = Counter()
    with gzip.open(files[0], "rt") as stream:
        for line in stream:
            rw = json.loads(line)["rankwatch"]
            counts[(rw["func"], rw["graph_captured"])] += 1
    return counts


@pytest.mark.parametrize("name", ["ddp-gpu", "ddp-healthy", "fsdp-gpu"])
def test_a_record_for_every_collective_pytorch_issued(name):
    """Flight Recorder's entries, plus the barrier issued after its dump, plus one
    record per CUDA-graph replay when the job replayed one."""
    run = RUNS / name
    issued = json.loads((run / "job" / "issued-rank0.json").read_text())
    expected: Counter = Counter()
    for key, n in issued["counts"].items():
        expected[(TORCH_TO_NCCL[key.split("|", 1)[1]], False)] += n
    expected[("AllReduce", False)] += 1  # the final barrier
    if name == "ddp-healthy":  # ran with --graph-metric: one graph replay per step
        expected[("AllReduce", True)] += _truth(run)["steps"]
    assert _record_counts(run) == expected


def test_jax_program_is_recorded_and_read():
    s = analyze((RUNS / "jax" / "dump",), store=None, quiet=True)
    expected = json.loads((RUNS / "jax" / "job" / "jax-expected.json").read_text())
    calls = expected["cases"]["all_gather"]["calls"]
    assert not s["problems"]
    # all_gather, psum_scatter and ppermute (a Send and a Recv) on both GPUs; psum and
    # the sharded matmul's all-reduce did not go through NCCL (see docs/validation.md)
    funcs = ("AllGather", "ReduceScatter", "Send", "Recv")
    assert s["ops_per_func"] == {f: 2 * calls for f in funcs}
    # one process drove both GPUs: two ranks in each communicator, told apart by device
    assert sorted(c["n_ranks"] for c in s["communicators"]) == [2, 2]
    assert (s["job"]["ranks"], s["job"]["processes"]) == (2, 1)
    assert [(r["world_rank"], r["device"], r["ops"]) for r in s["ranks"]] == [
        (0, 0, 4 * calls),
        (1, 1, 4 * calls),
    ]
    assert s["findings"] == []


def test_a_slow_gpu_of_a_jax_process_driving_both_is_named_by_its_rank():
    """One JAX process drove both GPUs; GPU 1 got extra work from step 30 (the step's
    ReduceScatter #31, after the compile call's #0). Before ranks were told apart by
    device, both were one process and no rank could be named."""
    s = analyze((RUNS / "jax-gpu" / "dump",), store=None, quiet=True)
    job = json.loads((RUNS / "jax-gpu" / "job" / "jax-straggler.json").read_text())
    assert (s["job"]["ranks"], s["job"]["processes"]) == (2, 1)
    assert [(r["world_rank"], r["device"]) for r in s["ranks"]] == [(0, 0), (1, 1)]
    [f] = s["findings"]
    assert (f["kind"], f["rank"], f["cause"]) == ("straggler", job["slow_device"], "gpu")
    assert f["device"] == job["slow_device"]  # one process: the GPU says which rank
    assert (f["evidence"]["onset"]["func"], f["since"]["seq"]) == (
        "ReduceScatter",
        job["slow_from_step"] + 1,
    )
    # the rank's own share of the slower steps: less than all the step time added
    # (the one host thread driving both GPUs was delayed too, for both ranks alike)
    added_s = sum(job["step_ms"][job["slow_from_step"] :]) / 1e3 - (
        (job["steps"] - job["slow_from_step"]) * job["median_step_ms_before"] / 1e3
    )
    assert 0.2 * added_s < f["cost_s"] < added_s


@pytest.mark.parametrize(
    "name", ["ddp-healthy", "ddp-gpu", "ddp-host", "fsdp-gpu", "jax", "jax-gpu"]
)
def test_findings_do_not_depend_on_how_the_records_are_batched(name: str) -> None:
    """A live monitor feeds the detectors in small batches, `analyze` in large ones:
    the same records give the same findings, from the same op on. (Real records
    include CUDA-graph replays that NCCL says ended before they were launched,
    which once made small batches count a rank a collective ahead: a desync.)"""
    from rankwatch.align import align
    from rankwatch.detect import detect
    from rankwatch.store import ingest

    run = ingest([RUNS / name / "dump"]).run()
    clock = align(run)

    def key(batch: int) -> list[tuple]:
        return [(f.kind, f.rank, f.cause, f.since.seq) for f in detect(run, clock, batch=batch)]

    whole = key(1 << 20)
    assert key(61) == whole
    assert key(1009) == whole


def test_inspector_only_logs_of_a_two_rank_job_say_what_cannot_be_told(tmp_path: Path) -> None:
    """The same real job as NCCL Inspector would log it (no rankwatch fields: sequence
    numbers, durations and bandwidth, no per-op timestamps): analysed without error,
    no finding invented, and the report says why ranks cannot be compared."""
    import subprocess
    import sys

    for path in sorted((RUNS / "ddp-gpu" / "dump").glob("*.log.gz")):
        out = tmp_path / path.name.removesuffix(".gz")
        with gzip.open(path, "rt") as src, out.open("w") as dst:
            for line in src:
                record = json.loads(line)
                record.pop("rankwatch", None)
                dst.write(json.dumps(record) + "\n")
    summary = analyze((tmp_path,), store=None, quiet=True)
    assert summary["job"]["formats"] == {"inspector": summary["job"]["op_records"]}
    assert summary["job"]["ranks"] == 2 and summary["findings"] == []
    done = subprocess.run(
        [sys.executable, "-m", "rankwatch", "analyze", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Late ranks: cannot be told (the records carry no per-op timestamps" in done.stdout
