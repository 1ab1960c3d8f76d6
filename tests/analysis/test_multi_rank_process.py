"""A process that holds several ranks (a single-controller JAX program, or one
process driving every GPU of a node) is analysed rank by rank: its CUDA device
tells its ranks apart and ties each one's ops across communicators. The job is
simulated twice from one seed, one process per rank and one per host."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rankwatch.cli.analyze import analyze
from rankwatch.simulate import DesyncFault, HangFault, SimConfig, SlowFault, simulate

SLOW_RANK = 5


def _key(summary: dict) -> list[tuple]:
    return [(f["kind"], f["rank"], f["cause"], f["since"]["seq"]) for f in summary["findings"]]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict[str, int]]:
    root = tmp_path_factory.mktemp("multi")
    cfg = SimConfig(
        ranks=8, hosts=2, tp=2, steps=60, seed=3, slow=SlowFault(SLOW_RANK, 20, "gpu", 3000)
    )
    simulate(cfg, root / "per-rank")
    res = simulate(dataclasses.replace(cfg, one_process_per_host=True), root / "per-host")
    apart = analyze((root / "per-rank",), store=None, quiet=True)
    together = analyze((root / "per-host",), store=None, quiet=True)
    pids = {r["host"]: r["pid"] for r in res.truth["ranks"]}
    # one pair of files per host, every rank's records in it
    assert sorted(p.name for p in (root / "per-host").glob("*.log")) == sorted(
        f"{h}-pid{p}.log" for h, p in pids.items()
    )
    for path in (root / "per-host").glob("*.log"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        devices = [r["rankwatch"]["device"] for r in lines]
        assert len(set(devices)) == 4
        switches = sum(a != b for a, b in zip(devices[:-1], devices[1:], strict=True))
        assert switches > len(lines) // 10  # interleaved as they happened, not one after another
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


@pytest.mark.parametrize(
    "fault",
    [
        {"hang": HangFault(5, 30)},
        {"desync": DesyncFault(6, 30, "size")},
        {"slow": SlowFault(3, 25, "host", 3000), "pp": 2},
        {"slow": SlowFault(2, 25, "transfer", 3000)},
    ],
    ids=["hang", "desync", "host", "transfer"],
)
def test_every_kind_of_finding_names_the_same_rank(tmp_path, fault: dict) -> None:
    """Hangs (from progress records, whose rank is mapped to its device through the
    communicator), desyncs and stragglers of every cause: as with a process per rank."""
    cfg = SimConfig(**{"ranks": 8, "hosts": 2, "tp": 2, "steps": 60, **fault})
    simulate(cfg, tmp_path / "per-rank")
    simulate(dataclasses.replace(cfg, one_process_per_host=True), tmp_path / "per-host")
    apart = analyze((tmp_path / "per-rank",), store=None, quiet=True)
    together = analyze((tmp_path / "per-host",), store=None, quiet=True)
    assert together["job"]["processes"] == 2
    assert _key(apart)
    assert _key(together) == _key(apart)


def _drop_devices(path: Path, which) -> None:  # noqa: ANN001 - which(line number, record)
    lines = []
    for i, line in enumerate(path.read_text().splitlines()):
        record = json.loads(line)
        obj = record.get("rankwatch", record)
        if which(i, obj):
            obj["device"] = None
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


def test_records_without_a_device_still_name_their_rank(tmp_path: Path) -> None:
    """Some op records of one GPU without a device (as from a communicator whose CUDA
    device could not be read), and a process's `comm` state records without one: each
    op is placed by its communicator and rank, so no rank is split or counted twice."""
    cfg = SimConfig(ranks=8, hosts=2, tp=2, steps=60, seed=3,
                    slow=SlowFault(SLOW_RANK, 20, "gpu", 3000))  # fmt: skip
    simulate(cfg, tmp_path / "per-rank")
    simulate(dataclasses.replace(cfg, one_process_per_host=True), tmp_path / "per-host")
    first, second = sorted((tmp_path / "per-host").glob("*.log"))
    _drop_devices(first, lambda i, r: r.get("device") == 1 and i % 2 == 0)
    state = second.with_name(second.name.replace(".log", ".rwstate.jsonl"))
    _drop_devices(state, lambda i, r: r.get("kind") == "comm")
    apart = analyze((tmp_path / "per-rank",), store=None, quiet=True)
    together = analyze((tmp_path / "per-host",), store=None, quiet=True)
    ranks = together["ranks"]
    assert [r["world_rank"] for r in ranks] == list(range(8))
    assert {r["ops"] for r in ranks} == {together["job"]["op_records"] // 8}
    assert _key(together) == _key(apart)


def test_a_process_using_two_devices_in_separate_communicators_holds_two_ranks() -> None:
    """Process P drives GPU 0 in communicator A and GPU 1 in communicator B, with no
    communicator holding both (e.g. two pipeline halves): still two ranks, in align's
    tables and in the detectors' topology alike."""
    import duckdb

    from rankwatch.align.ranks import map_ranks
    from rankwatch.detect.topology import Topology
    from rankwatch.model import Run
    from rankwatch.store.tables import create_all

    con = duckdb.connect()
    create_all(con)
    members = [  # comm, rank, host, pid, device
        ("0xa", 0, "h", 1, 0), ("0xa", 1, "h", 2, 2),
        ("0xb", 0, "h", 1, 1), ("0xb", 1, "h", 3, 3),
    ]  # fmt: skip
    for comm, rank, host, pid, device in members:
        con.execute(
            "INSERT INTO ops (comm_id, comm_key, comm_name, n_ranks, rank, host, pid, device, "
            "kind, func, seq) VALUES (?, ?, 'c', 2, ?, ?, ?, ?, 'coll', 'AllReduce', 0)",
            [comm, comm, rank, host, pid, device],
        )
    run = Run(con, tables={"ops": "ops"})
    map_ranks(run)
    procs = con.execute(
        "SELECT host, pid, device, multi_rank FROM processes ORDER BY pid, device"
    ).fetchall()
    assert procs == [("h", 1, 0, True), ("h", 1, 1, True), ("h", 2, None, False),
                     ("h", 3, None, False)]  # fmt: skip
    world = con.execute("SELECT count(DISTINCT world_rank) FROM processes").fetchall()[0][0]
    assert world == 4
    topo = Topology.from_run(run)
    assert sorted((p.pid, p.device) for p in topo.procs) == [(1, 0), (1, 1), (2, None), (3, None)]
