"""The Grafana dashboard and the monitor's metrics, against a real Prometheus.

1. The dashboard JSON's structure: what Grafana needs and fails open without
   (uid, title, schemaVersion, unique panel ids inside the 24-column grid, a
   `$datasource` variable every panel uses, units, every variable declared).
2. `promtool check rules` over every panel query, and `promtool check metrics`
   over a real /metrics page.
3. A real Prometheus server (Debian's `prometheus`, which .ci/run installs)
   scrapes a real `rankwatch monitor` fed by a real fake-NCCL job, and every
   panel query returns data through /api/v1/query.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from serve_support import (
    REPO_ROOT,
    Job,
    free_port,
    needs_driver,
    start_job,
    start_monitor,
    wait_for,
)

from rankwatch.serve.attach import plugin_streams

DASHBOARD = REPO_ROOT / "dashboards" / "rankwatch.json"
PROVISIONING = REPO_ROOT / "dashboards" / "provisioning"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Debian's prometheus package is not installed (apt-get install prometheus; "
    ".ci/run does)",
)
# what Grafana substitutes, for a query Prometheus can run by itself
VARIABLES = {"$__rate_interval": "20s", "$job": ".*", "$phase": "gpu_start"}
JOB = Job(ranks=4, steps=4000, pause_us=1000, slow_rank=2, slow_from=100, job_id="grafana")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]]


def substitute(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


# ---------------------------------------------------------------------- structure
def test_dashboard_has_what_grafana_needs() -> None:
    d = dashboard()
    assert d["uid"] and len(d["uid"]) <= 40 and d["title"] and d["schemaVersion"] >= 30
    panels = d["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert p["type"] != "graph"  # the legacy panel
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    used = {m for _, e in panel_queries() for m in re.findall(r"\$(\w+)", e)}
    assert used - {"__rate_interval"} <= set(variables), used


def test_every_series_a_panel_reads_is_one_the_monitor_exports() -> None:
    docs = (REPO_ROOT / "docs" / "monitor.md").read_text()
    names = {n for _, e in panel_queries() for n in re.findall(r"\brankwatch_\w+", e)}
    for name in names:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"`{base}`" in docs, f"{name} is not in docs/monitor.md"


def test_provisioning_files_point_grafana_at_the_dashboard_and_prometheus() -> None:
    providers = (PROVISIONING / "dashboards" / "rankwatch.yaml").read_text()
    for needed in ("apiVersion: 1", "providers:", "type: file", "path:"):
        assert needed in providers
    sources = (PROVISIONING / "datasources" / "rankwatch.yaml").read_text()
    for needed in ("apiVersion: 1", "datasources:", "type: prometheus", "url:"):
        assert needed in sources


# ---------------------------------------------------------------------- promtool
@needs_prometheus
def test_promtool_accepts_every_panel_query(tmp_path: Path) -> None:
    rules = ["groups:", "  - name: rankwatch-dashboard", "    rules:"]
    for i, (_, expr) in enumerate(panel_queries()):
        rules += [
            f"      - record: rankwatch:panel_{i}",
            f"        expr: {json.dumps(substitute(expr))}",
        ]
    path = tmp_path / "panels.rules.yml"
    path.write_text("\n".join(rules) + "\n")
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------- a real Prometheus
def _prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: rankwatch\n    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(ready, 60, "prometheus to be ready", every=0.2)
    return proc, url


def _query(url: str, expr: str) -> list:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}api/v1/query?{q}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@needs_prometheus
@needs_driver
def test_every_panel_query_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    dump = tmp_path / "job"
    dump.mkdir()
    streams = plugin_streams()
    mon = start_monitor(tmp_path, *([] if streams else ["--watch", str(dump)]))
    prom = None
    running = start_job(JOB, dump, {"RANKWATCH_COLLECTOR": mon.listen} if streams else {})
    try:
        target = mon.url.split("//", 1)[1].rstrip("/")
        prom, url = _prometheus(tmp_path, target)
        wait_for(lambda: (mon.job("grafana") or {}).get("findings"), 90, "a finding")
        queries = [(title, substitute(e)) for title, e in panel_queries()]

        def all_have_data() -> bool:
            return all(_query(url, e) for _, e in queries)

        try:
            wait_for(all_have_data, 60, "every panel query to return data", every=1.0)
        except AssertionError:
            empty = [title for title, e in queries if not _query(url, e)]
            raise AssertionError(f"panels without data: {empty}") from None
        # and the page Prometheus scrapes passes its own linter
        page = mon.metrics()
        lint = subprocess.run(
            [PROMTOOL, "check", "metrics"], input=page, capture_output=True, text=True
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
        assert _query(url, 'up{job="rankwatch"} == 1')
    finally:
        running.kill()
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        mon.stop()
