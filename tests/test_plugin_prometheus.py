"""The plugin's Prometheus textfile, read back with the Prometheus client's own parser."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from driver import run_driver


def _families(dump: Path) -> dict:
    (prom,) = dump.glob("*.prom")
    assert not list(dump.glob("*.tmp"))  # written through a temp file, renamed
    return {f.name: f for f in text_string_to_metric_families(prom.read_text())}


def test_textfile_has_base_unit_counters_and_inspector_gauges(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "basic", "--ops", "20",
                     env={"RANKWATCH_PROM": "1", "RANKWATCH_JOB_ID": "job7"})
    assert run.returncode == 0, run.stderr
    families = _families(tmp_path)
    # rankwatch's own metrics: counters in base units (the parser drops _total)
    assert families["rankwatch_ops"].type == "counter"
    ops = {s.labels["op"]: s.value for s in families["rankwatch_ops"].samples
           if s.name == "rankwatch_ops_total"}
    issued = run.summary["comms"][0]["colls"]
    assert ops == {func: float(n) for func, n in issued.items() if n}
    payload = families["rankwatch_op_payload_bytes"].samples
    assert all(s.value > 0 for s in payload)
    # NCCL Inspector's names and labels, for its Grafana dashboard
    busbw = families["nccl_bus_bandwidth_gbs"].samples
    assert busbw and all(s.labels["slurm_job_id"] == "job7" for s in busbw)
    assert {"collective", "message_size", "algo_proto", "nranks"} <= set(busbw[0].labels)


def test_inspector_prom_variable_turns_it_on(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "basic", env={"NCCL_INSPECTOR_PROM_DUMP": "1"})
    assert run.returncode == 0, run.stderr
    assert "rankwatch_build_info" in _families(tmp_path)
