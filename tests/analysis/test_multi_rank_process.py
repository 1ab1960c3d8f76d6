"""A process that holds several ranks (a single-controller JAX program, or one
process driving every GPU of a node) is analysed rank by rank: its CUDA device
tells its ranks apart and ties each one's ops across communicators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankwatch.cli.analyze import analyze
from rankwatch.simulate import SimConfig, SlowFault, simulate

SLOW_RANK = 5


def _one_process_per_host(src: Path, dst: Path) -> dict[str, int]:
    """The simulated job as if each host ran one process driving all its GPUs:
    every record of a host gets that host's first pid, in one pair of files."""
    dst.mkdir()
    pid_of: dict[str, int] = {}
    for path in sorted(src.glob("*.log")):
        host = path.name.split("-pid")[0]
        pid_of.setdefault(host, int(path.name.split("-pid")[1].split(".")[0]))
    for path in sorted(src.iterdir()):
        if not path.name.endswith((".log", ".rwstate.jsonl")):
            continue
        host = path.name.split("-pid")[0]
        suffix = ".log" if path.name.endswith(".log") else ".rwstate.jsonl"
        with (dst / f"{host}-pid{pid_of[host]}{suffix}").open("a") as out:
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if "metadata" in record:
                    record["metadata"]["pid"] = pid_of[host]
                else:
                    record["pid"] = pid_of[host]
                out.write(json.dumps(record) + "\n")
    return pid_of


def _key(summary: dict) -> list[tuple]:
    return [(f["kind"], f["rank"], f["cause"], f["since"]["seq"]) for f in summary["findings"]]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict[str, int]]:
    root = tmp_path_factory.mktemp("multi")
    cfg = SimConfig(
        ranks=8, hosts=2, tp=2, steps=60, seed=3, slow=SlowFault(SLOW_RANK, 20, "gpu", 3000)
    )
    simulate(cfg, root / "per-rank")
    pids = _one_process_per_host(root / "per-rank", root / "per-host")
    apart = analyze((root / "per-rank",), store=None, quiet=True)
    together = analyze((root / "per-host",), store=None, quiet=True)
    return apart, together, pids


def test_every_rank_of_a_process_is_its_own_rank(jobs) -> None:
    _, together, pids = jobs
    job = together["job"]
    assert (job["ranks"], job["processes"], job["hosts"]) == (8, 2, 2)
    ranks = together["ranks"]
    assert [r["world_rank"] for r in ranks] == list(range(8))
    assert {(r["host"], r["pid"]) for r in ranks} == set(pids.items())
    assert len({(r["host"], r["device"]) for r in ranks}) == 8  # a device per rank
    # every rank has its own ops, none counted twice
    assert sum(r["ops"] for r in ranks) == job["op_records"]
    assert len({r["ops"] for r in ranks}) == 1


def test_findings_are_the_same_as_with_one_process_per_rank(jobs) -> None:
    apart, together, _ = jobs
    assert _key(apart)
    assert _key(together) == _key(apart)
    straggler = together["findings"][0]
    assert (straggler["kind"], straggler["rank"], straggler["cause"]) == (
        "straggler",
        SLOW_RANK,
        "gpu",
    )
