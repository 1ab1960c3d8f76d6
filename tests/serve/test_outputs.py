"""What the monitor gives out besides the page: Prometheus metrics that follow the
naming conventions with bounded labels, Parquet files in the store's layout, and
alerts for new findings on stdout and to a webhook. Fed with a real fake-NCCL
job's records."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import duckdb
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_support import (
    Job,
    needs_driver,
    offline_findings,
    record_lines,
    run_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.intake import Chunk, Source
from rankwatch.serve.live import LiveState
from rankwatch.serve.metrics import render
from rankwatch.serve.protocol import split_lines
from rankwatch.serve.sender import process_files, replay

pytestmark = needs_driver
JOB = Job(ranks=4, steps=100, pause_us=2000, slow_rank=2, slow_from=50, slow_us=4000,
          job_id="outputs")  # fmt: skip


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's records, with its straggler found (a loaded machine can hide it: the
    alert tests need a finding, so the job runs again, up to three times)."""
    for _ in range(3):
        dump = run_job(JOB, tmp_path_factory.mktemp("outputs-job"))
        if any(f["kind"] == "straggler" and f["rank"] == 2 for f in offline_findings(dump)):
            return dump
    raise AssertionError("rank 2 was never found slow in three runs of the job")


def fed_state(records: Path) -> LiveState:
    """A LiveState (in this process) fed every record, as one batch, its job ended."""
    state = LiveState()
    items = []
    for p in process_files(records):
        lines = b"".join(line for _, line in p.lines())
        items.append(Chunk(Source(str(p.ops), p.ops.name, "test"), split_lines(lines)))
    state.accept(items, wall=1000.0)
    state.tick(wall=2000.0)
    return state


def test_metrics_follow_the_naming_conventions(records: Path) -> None:
    state = fed_state(records)
    families = {f.name: f for f in text_string_to_metric_families(render(state.snapshot()))}
    assert all(name.startswith("rankwatch_") for name in families)
    for name, fam in families.items():
        if fam.type == "counter":  # the parser strips _total from counter family names
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), name
        assert not name.endswith(("_ms", "_us", "_gbs", "_microseconds")), name
    for kind in ("straggler", "hang", "desync"):
        assert any(
            s.labels == {"job": "outputs", "kind": kind}
            for s in families["rankwatch_active_findings"].samples
        )
    late = families["rankwatch_rank_recent_lateness_seconds"].samples
    assert {s.labels["rank"] for s in late} == {"0", "1", "2", "3"}
    hist = families["rankwatch_collective_duration_seconds"]
    assert hist.type == "histogram"
    ops = {s.labels["op"] for s in hist.samples}
    assert ops == {"AllReduce", "AllGather", "ReduceScatter"}
    count = sum(
        s.value for s in hist.samples if s.name.endswith("_count") and s.labels["job"] == "outputs"
    )
    assert count == record_lines(records)["op"]  # every op record, once
    received = families["rankwatch_job_records"].samples
    assert {s.labels["kind"]: s.value for s in received} == record_lines(records)


def test_per_rank_series_are_bounded(records: Path) -> None:
    text = render(fed_state(records).snapshot(), max_rank_series=2)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    late = families["rankwatch_rank_recent_lateness_seconds"].samples
    assert len({s.labels["rank"] for s in late}) == 2  # the two latest ranks only
    assert "rankwatch_rank_lateness_seconds" not in families  # no per-rank counters
    assert "rankwatch_rank_info" not in families


def test_parquet_holds_every_record_in_the_store_layout(records: Path, tmp_path: Path) -> None:
    out = tmp_path / "parquet"
    mon = start_monitor(tmp_path, "--parquet", str(out))
    try:
        replay(records, mon.listen)
        wait_for(lambda: (mon.job("outputs") or {}).get("phase") == "ended", 60, "the job's end")
    finally:
        mon.stop()  # flushes
    ops = str(out / "ops" / "**" / "*.parquet")
    con = duckdb.connect()
    n, jobs, ranks = con.execute(
        f"SELECT count(*), count(DISTINCT job), count(DISTINCT rank) "
        f"FROM read_parquet('{ops}', hive_partitioning = true)"
    ).fetchall()[0]
    assert (n, jobs, ranks) == (record_lines(records)["op"], 1, JOB.ranks)
    progress = str(out / "progress" / "**" / "*.parquet")
    assert con.execute(f"SELECT count(*) FROM read_parquet('{progress}')").fetchall()[0][0] > 0
    assert not list(out.rglob("*.tmp"))


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - the handler API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_new_findings_alert_on_stdout_and_to_the_webhook(records: Path, tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    mon = start_monitor(tmp_path, "--webhook", url)
    try:
        replay(records, mon.listen)
        job = wait_for(
            lambda: (mon.job("outputs") or {}).get("phase") == "ended" and mon.job("outputs"),
            60,
            "the job's end",
        )
        wait_for(lambda: len(_Hook.received) >= len(job["findings"]), 30, "the webhook posts")
    finally:
        mon.stop()
        server.shutdown()
    assert job["findings"]
    # every finding was alerted once, on stdout and to the webhook (a finding the
    # detectors refined while the job ran may have been alerted before it changed)
    alerted = [line for _, line in mon.alerts()]
    posted = [(h["finding"]["kind"], h["finding"]["rank"], h["finding"]["cause"])
              for h in _Hook.received]  # fmt: skip
    assert len(alerted) == len(posted) == len(set(posted))
    assert {(f["kind"], f["rank"], f["cause"]) for f in job["findings"]} <= set(posted)
    assert all(h["job"] == "outputs" and h["summary"] for h in _Hook.received)


def test_a_dead_webhook_is_counted_and_never_holds_detection_up(
    records: Path, tmp_path: Path
) -> None:
    mon = start_monitor(tmp_path, "--webhook", "http://127.0.0.1:9/nothing-listens")
    try:
        replay(records, mon.listen)
        wait_for(lambda: (mon.job("outputs") or {}).get("phase") == "ended", 60, "the job's end")
        wait_for(mon.alerts, 30, "stdout alerts, which go out regardless")
        wait_for(lambda: 'outcome="failed"' in mon.metrics(), 30, "the failed post counted")
    finally:
        mon.stop()


def test_a_job_id_used_again_after_its_job_ended_is_a_new_job(records: Path) -> None:
    state = fed_state(records)
    again = run_job(JOB, records.parent / "again")
    items = [
        Chunk(
            Source(str(p.ops), p.ops.name, "test"), split_lines(b"".join(x for _, x in p.lines()))
        )
        for p in process_files(again)
    ]
    state.accept(items, wall=3000.0)
    state.tick(wall=4000.0)
    assert sorted(state.jobs) == ["outputs", "outputs#2"]
    assert state.jobs["outputs#2"].records == record_lines(again)


def test_every_metric_is_documented(records: Path) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "monitor.md").read_text()
    for fam in text_string_to_metric_families(render(fed_state(records).snapshot())):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        assert f"`{name}`" in docs, f"{name} is not in docs/monitor.md"
