"""Scale-out over a real nats-server: `rankwatch agent`s relay real plugin streams of
fake-NCCL jobs, `rankwatch monitor --nats` workers share the communicators.

(a) Two jobs (one communicator each, one straggler each) stream through two agents
    (every job's ranks spread over both, as over two nodes). Two workers of one queue
    group split the communicator buckets: each gets a nonempty, disjoint share, and
    together they find what a lone worker (its own group, same messages) finds, and
    what `rankwatch analyze` finds in the files: (kind, rank, cause, onset seq).
(b) The NATS server is killed mid-job and restarted: the agent reconnects, keeps
    publishing, and counts what it dropped meanwhile; the worker learns of the gap.
(c) An agent listening off loopback needs a token, and then every stream must send it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from nats_support import NatsServer, finished, needs_nats, start_agent, start_job_via
from serve_support import (
    Job,
    MonitorProc,
    free_port,
    needs_driver,
    offline_findings,
    record_lines,
    start_monitor,
    wait_for,
)

from rankwatch.serve.nats_bus import DEFAULT_BUCKETS, bucket_of

pytestmark = [needs_driver, needs_nats]


def onset_keys(findings: list[dict[str, Any]]) -> list[tuple]:
    return sorted((f["kind"], f["rank"], f["cause"], (f.get("since") or {}).get("seq"))
                  for f in findings)  # fmt: skip


def nats_view(mon: MonitorProc) -> dict[str, Any]:
    return mon.state()["monitor"].get("nats", {})


def worker(tmp: Path, url: str, group: str) -> MonitorProc:
    return start_monitor(tmp, "--nats", url, "--queue-group", group, "--listen", "none")


def ended_job(mon: MonitorProc, key: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict | None:
        job = mon.job(key)
        return job if job and job["phase"] == "ended" else None

    return wait_for(done, timeout, f"job {key} to end")


def comm_in(buckets: list[int], taken: set[str]) -> str:
    """A communicator id (as the plugin writes it) whose bucket is among `buckets`."""
    for i in range(1, 100_000):
        cid = f"0x5eed0000{i:08x}"
        if cid not in taken and bucket_of(cid.encode(), DEFAULT_BUCKETS) in buckets:
            return cid
    raise AssertionError("no communicator id lands in these buckets")


def test_two_workers_split_the_communicators_and_find_what_one_finds(tmp_path: Path) -> None:
    server = NatsServer(free_port()).start()
    mons: list[MonitorProc] = []
    agents = []
    try:
        pair = [worker(tmp_path, server.url, "pair") for _ in range(2)]
        solo = worker(tmp_path, server.url, "solo")
        mons = [*pair, solo]
        views = wait_for(lambda: _settled(pair, solo), 30, "the workers to split the buckets")
        share = [set(v["buckets"]) for v in views[:2]]
        assert share[0] and share[1] and not share[0] & share[1]
        assert share[0] | share[1] == set(range(DEFAULT_BUCKETS))
        cid_a = comm_in(sorted(share[0]), set())
        cid_b = comm_in(sorted(share[1]), {cid_a})
        jobs = {
            "natsA": Job(ranks=4, steps=100, pause_us=2000, slow_rank=2, slow_from=50,
                         slow_us=4000, job_id="natsA", comm_id=cid_a),
            "natsB": Job(ranks=4, steps=100, pause_us=2000, slow_rank=1, slow_from=40,
                         slow_us=4000, job_id="natsB", comm_id=cid_b),
        }  # fmt: skip
        agents = [start_agent(tmp_path, server.url, f"node{i}") for i in range(2)]
        listen = [a.listen for a in agents]
        running = {k: start_job_via(j, tmp_path / k, listen) for k, j in jobs.items()}
        for r in running.values():
            finished(r)
        owners = {"natsA": pair[0], "natsB": pair[1]}
        for key, mon in owners.items():
            live, alone = ended_job(mon, key), ended_job(solo, key)
            offline = onset_keys(offline_findings(tmp_path / key))
            assert onset_keys(live["findings"]) == onset_keys(alone["findings"]) == offline
            assert live["records"] == alone["records"] == record_lines(tmp_path / key)
        # disjoint: neither pair worker saw the other's communicator at all
        assert [j["key"] for j in pair[0].state()["jobs"]] == ["natsA"]
        assert [j["key"] for j in pair[1].state()["jobs"]] == ["natsB"]
        # the summaries count every op record once per group, whichever worker took them
        ops = sum(record_lines(tmp_path / k)["op"] for k in jobs)
        wait_for(lambda: sum(nats_view(m)["summary_ops"] for m in pair) == ops, 10,
                 "the pair's summaries to count every op")  # fmt: skip
        assert nats_view(solo)["summary_ops"] == ops
        assert all(nats_view(m)["liveness"] == {"natsA": 4, "natsB": 4} for m in mons)
    finally:
        for a in agents:
            a.stop()
        for m in mons:
            m.stop()
        server.kill()


def _settled(pair: list[MonitorProc], solo: MonitorProc) -> list[dict] | None:
    views = [nats_view(m) for m in [*pair, solo]]
    if any(len(v.get("members", [])) != 2 for v in views[:2]) or not views[2].get("buckets"):
        return None
    total = sum(len(v["buckets"]) for v in views[:2])
    return views if total == DEFAULT_BUCKETS and len(views[2]["buckets"]) == total else None


def test_an_agent_survives_a_nats_restart_and_counts_what_it_dropped(tmp_path: Path) -> None:
    server = NatsServer(free_port()).start()
    mon = worker(tmp_path, server.url, "solo")
    agent = start_agent(tmp_path, server.url, "node0")
    job = Job(ranks=4, steps=1500, pause_us=4000, job_id="restart")
    try:
        wait_for(lambda: nats_view(mon).get("buckets"), 30, "the worker to own buckets")
        running = start_job_via(job, tmp_path / "job", [agent.listen])
        wait_for(lambda: agent.status().get("published", {}).get("records", 0) > 500, 60,
                 "the agent to publish")  # fmt: skip
        server.kill()
        wait_for(lambda: agent.status().get("dropped", {}).get("nats_down", 0) > 0, 30,
                 "the agent to count records it cannot send")  # fmt: skip
        before = agent.status()["published"]["records"]
        server.start()
        wait_for(lambda: agent.status()["nats"]["reconnects"] >= 1, 30, "the agent to reconnect")
        finished(running)
        live = ended_job(mon, "restart")
        status = wait_for(lambda: _drained(agent, tmp_path / "job"), 30, "the agent to drain")
        gaps = mon_dropped(mon, live)
    finally:
        agent.stop()
        mon.stop()
        server.kill()
    files = record_lines(tmp_path / "job")
    assert status["received"] == files  # the local streams never broke
    assert status["published"]["records"] > before  # publishing resumed after the restart
    dropped = sum(status["dropped"].values())
    assert status["published"]["records"] + dropped <= sum(files.values())
    assert dropped > 0
    # the worker kept going, knows its view has gaps, and saw what came after the restart
    assert 0 < live["records"]["op"] < files["op"]
    assert gaps > 0


def _drained(agent: Any, dump: Path) -> dict | None:
    s = agent.status()
    return s if s.get("received") == record_lines(dump) else None


def mon_dropped(mon: MonitorProc, live: dict) -> int:
    return sum(p["dropped"]["stream"] for p in live["ranks"]) + int(
        mon.state()["monitor"]["records_dropped"].get("upstream_dropped", 0)
    )


def test_an_agent_off_loopback_needs_a_token(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "rankwatch", "agent", "--listen", f"tcp://0.0.0.0:{port}",
           "--nats", "nats://127.0.0.1:1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env=_env_without_token())  # fmt: skip
    assert done.returncode != 0
    assert "token" in done.stderr and "not loopback" in done.stderr
    # with a token, a stream without it is turned away and one with it is served
    from rankwatch.serve.sender import StreamSender

    status = tmp_path / "status.json"
    proc = subprocess.Popen([*cmd, "--token", "s3cret", "--status-file", str(status),
                             "--window", "0.2"], stderr=subprocess.DEVNULL,
                            env=_env_without_token())  # fmt: skip
    try:
        wait_for(lambda: _listening(port), 30, "the agent to listen")
        for token in ("wrong", None, "s3cret"):
            s = StreamSender(f"tcp://127.0.0.1:{port}", "h", 1, job_id="t", token=token)
            time.sleep(0.3)
            s.close()
        import json

        def counted() -> dict | None:
            st = json.loads(status.read_text()) if status.exists() else {}
            return st if st.get("streams", {}).get("connections", 0) >= 3 else None

        st = wait_for(counted, 30, "the agent to count the streams")
        assert st["streams"]["rejected"].get("bad_token") == 2
    finally:
        proc.terminate()
        proc.wait(30)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _env_without_token() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "RANKWATCH_COLLECTOR_TOKEN"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-q"]))
