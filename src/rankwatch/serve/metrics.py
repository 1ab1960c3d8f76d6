"""`/metrics`: the monitor's state in the Prometheus text format (version 0.0.4).

Conventions (docs/monitor.md lists every series): one `rankwatch_` prefix, base
units (`_seconds`, `_bytes`), `_total` on counters, rates left to PromQL (bus
bandwidth is rate(bus bytes) / rate(duration sum)). Labels stay bounded: job
(at most the monitor's --max-jobs), op and size_class (a dozen power-of-4
classes), kind/reason/phase (fixed sets). Per-rank series exist only for jobs of
at most `max_rank_series` ranks; larger jobs export per-rank lateness for that
many latest ranks only, and no per-rank counters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from rankwatch.serve.traffic import DURATION_BUCKETS_S

MAX_FINDING_SERIES = 64  # rankwatch_finding series per job
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Exposition:
    """Families in declaration order, each with HELP and TYPE once and its samples
    together (the text format wants a family's samples contiguous)."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.families.setdefault(name, (kind, help_text, []))

    def sample(
        self, name: str, labels: dict[str, Any], value: float, family: str | None = None
    ) -> None:
        self.families[family or name][2].append(f"{name}{_labels(labels)} {_value(value)}")

    def text(self) -> str:
        lines = []
        for name, (kind, help_text, samples) in self.families.items():
            if samples:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def render(snapshot: dict[str, Any], max_rank_series: int = 256) -> str:
    """The exposition text of a LiveState snapshot (with the monitor's transport data)."""
    e = Exposition()
    m = snapshot["monitor"]
    _monitor(e, m)
    for job in snapshot["jobs"]:
        _job(e, job, max_rank_series)
    findings_total = m.get("findings_total", [])
    e.family("rankwatch_findings_total", "counter", "Findings reported (alerted), by kind.")
    for row in findings_total:
        e.sample("rankwatch_findings_total", {"job": row["job"], "kind": row["kind"]}, row["count"])
    return e.text()


# Known reasons are exported at 0 before they first happen, so rate() and alert
# rules see the series from the start.
KNOWN_REASONS = {
    "rankwatch_records_dropped_total": (
        "monitor_overloaded", "job_ended", "too_many_jobs", "no_job_yet", "batch_failed",
    ),
    "rankwatch_lines_rejected_total": (
        "malformed", "not_a_record", "missing_key_field", "newer_schema", "bad_state_record",
        "unterminated",
    ),
    "rankwatch_frames_rejected_total": (
        "oversized", "bad_hello", "newer_protocol", "bad_token", "hello_timeout", "truncated",
        "too_many_connections",
    ),
}  # fmt: skip


def _counter_family(e: Exposition, name: str, help_text: str, values: dict, label: str) -> None:
    e.family(name, "counter", help_text)
    values = {**dict.fromkeys(KNOWN_REASONS.get(name, ()), 0), **values}
    for k, v in sorted(values.items()):
        e.sample(name, {label: k}, v)


def _monitor(e: Exposition, m: dict[str, Any]) -> None:
    e.family("rankwatch_build_info", "gauge", "rankwatch version of this monitor.")
    e.sample("rankwatch_build_info", {"version": m["version"]}, 1)
    e.family("rankwatch_start_time_seconds", "gauge", "When the monitor started (Unix time).")
    e.sample("rankwatch_start_time_seconds", {}, float(m["started"]))
    _counter_family(
        e,
        "rankwatch_records_received_total",
        "Record lines received from streams and watched files, by kind (op or state).",
        m.get("records_received", {"op": 0, "state": 0}),
        "kind",
    )
    _counter_family(
        e,
        "rankwatch_records_dropped_total",
        "Records the monitor received but did not process, by reason (the files keep them).",
        m.get("records_dropped", {}),
        "reason",
    )
    _counter_family(
        e,
        "rankwatch_lines_rejected_total",
        "Lines skipped as not decodable or not valid records, by reason.",
        m.get("lines_rejected", {}),
        "reason",
    )
    _counter_family(
        e,
        "rankwatch_frames_rejected_total",
        "Connections closed for breaking the stream protocol, by reason.",
        m.get("frames_rejected", {}),
        "reason",
    )
    simple = (
        ("rankwatch_frames_received_total", "counter", "Stream frames received.", "frames"),
        ("rankwatch_received_bytes_total", "counter", "Stream bytes received.", "bytes"),
        ("rankwatch_connections_total", "counter", "Stream connections accepted.", "connections"),
        ("rankwatch_open_connections", "gauge", "Stream connections open now.", "open"),
        ("rankwatch_watched_files", "gauge", "Record files tailed (--watch).", "watched_files"),
        ("rankwatch_intake_queued_bytes", "gauge", "Lines waiting for processing.", "intake_bytes"),
        ("rankwatch_intake_limit_bytes", "gauge", "Intake bound.", "intake_limit_bytes"),
        (
            "rankwatch_intake_lag_seconds",
            "gauge",
            "How long the oldest line waiting for processing has waited.",
            "intake_lag_s",
        ),
        ("rankwatch_batches_total", "counter", "Batches processed.", "batches"),
        (
            "rankwatch_batch_seconds_total",
            "counter",
            "Time spent processing batches.",
            "batch_seconds",
        ),
    )
    for name, kind, help_text, key in simple:
        if key in m:
            e.family(name, kind, help_text)
            e.sample(name, {}, m[key])
    for name, help_text, key, label in (
        ("rankwatch_alerts_total", "Alerts sent, by sink and outcome.", "alerts", "sink_outcome"),
        ("rankwatch_parquet_rows_total", "Rows written to Parquet, by table.", "parquet", "table"),
    ):
        values = m.get(key) or {}
        e.family(name, "counter", help_text)
        for k, v in sorted(values.items()):
            if label == "sink_outcome":
                sink, outcome = k.split(":", 1)
                e.sample(name, {"sink": sink, "outcome": outcome}, v)
            else:
                e.sample(name, {label: k}, v)


def _job(e: Exposition, job: dict[str, Any], max_rank_series: int) -> None:
    j = job["key"]
    e.family(
        "rankwatch_job_state", "gauge", "1 for the job's current state (warming, live, ended)."
    )
    for state in ("warming", "live", "ended"):
        e.sample("rankwatch_job_state", {"job": j, "state": state}, int(job["phase"] == state))
    e.family("rankwatch_job_ranks", "gauge", "Processes (ranks) of the job seen so far.")
    e.sample("rankwatch_job_ranks", {"job": j}, len(job["ranks"]))
    e.family("rankwatch_job_records_total", "counter", "Records processed for the job, by kind.")
    for kind, n in sorted(job["records"].items()):
        e.sample("rankwatch_job_records_total", {"job": j, "kind": kind}, n)
    e.family(
        "rankwatch_job_last_record_timestamp_seconds",
        "gauge",
        "When the job's newest record arrived (Unix time).",
    )
    e.sample("rankwatch_job_last_record_timestamp_seconds", {"job": j}, float(job["last_record"]))
    if job.get("last_progress_ns"):
        e.family(
            "rankwatch_last_progress_timestamp_seconds",
            "gauge",
            "Host time of the job's newest progress record (Unix time).",
        )
        e.sample(
            "rankwatch_last_progress_timestamp_seconds", {"job": j}, job["last_progress_ns"] / 1e9
        )
    _ranks(e, j, job["ranks"], max_rank_series)
    _findings(e, j, job)
    _traffic(e, j, job["traffic"])


def _ranks(e: Exposition, j: str, ranks: list[dict], limit: int) -> None:
    ranks = [r for r in ranks if r["rank"] is not None]
    small = len(ranks) <= limit
    if not small:  # the latest ranks only: a fixed budget of series per job
        ranks = sorted(ranks, key=_recent, reverse=True)[:limit]
    e.family(
        "rankwatch_rank_recent_lateness_seconds",
        "gauge",
        "Mean delay of the rank behind the earliest rank of each collective, last 10 s.",
    )
    for r in ranks:
        for phase, v in r["lateness_s"].items():
            if v is not None:
                labels = {"job": j, "rank": r["rank"], "phase": phase}
                e.sample("rankwatch_rank_recent_lateness_seconds", labels, v)
    if not small:
        return
    e.family(
        "rankwatch_rank_info", "gauge", "Rank identity, for joins (e.g. with DCGM by Hostname)."
    )
    e.family(
        "rankwatch_rank_lateness_seconds_total",
        "counter",
        "Summed delay of the rank behind the earliest rank of each collective.",
    )
    e.family(
        "rankwatch_rank_lateness_collectives_total",
        "counter",
        "Collectives counted in rankwatch_rank_lateness_seconds_total.",
    )
    e.family(
        "rankwatch_plugin_dropped_records_total",
        "counter",
        "Records the rank's plugin could not record or stream, by reason.",
    )
    for r in ranks:
        info = {"job": j, "rank": r["rank"], "Hostname": r["host"], "pid": r["pid"]}
        info["gpu"] = "" if r["gpu"] is None else r["gpu"]
        e.sample("rankwatch_rank_info", info, 1)
        for phase, t in r["lateness_total"].items():
            labels = {"job": j, "rank": r["rank"], "phase": phase}
            e.sample("rankwatch_rank_lateness_seconds_total", labels, t["seconds"])
            e.sample("rankwatch_rank_lateness_collectives_total", labels, t["count"])
        for reason, n in r["dropped"].items():
            labels = {"job": j, "rank": r["rank"], "reason": reason}
            e.sample("rankwatch_plugin_dropped_records_total", labels, n)


def _recent(r: dict) -> float:
    values = [v for v in r["lateness_s"].values() if v is not None]
    return max(values, default=0.0)


def _findings(e: Exposition, j: str, job: dict[str, Any]) -> None:
    findings = job["findings"]
    by_kind: dict[str, int] = {}
    for f in findings:
        by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
    e.family("rankwatch_active_findings", "gauge", "Current findings of the job, by kind.")
    for kind in sorted({"straggler", "hang", "desync", *by_kind}):
        e.sample("rankwatch_active_findings", {"job": j, "kind": kind}, by_kind.get(kind, 0))
    e.family("rankwatch_finding", "gauge", "1 per current finding: its kind, rank and cause.")
    for f in findings[:MAX_FINDING_SERIES]:
        labels = {
            "job": j,
            "kind": f["kind"],
            "rank": "" if f["rank"] is None else f["rank"],
            "cause": f["cause"] or "",
        }
        e.sample("rankwatch_finding", labels, 1)
    hangs = job["hangs"]
    e.family(
        "rankwatch_hang", "gauge", "1 while the job has a hang (an op stuck past the threshold)."
    )
    e.sample("rankwatch_hang", {"job": j}, int(bool(hangs)))
    ages = [h["evidence"].get("age_s") or 0.0 for h in hangs]
    e.family("rankwatch_hang_age_seconds", "gauge", "Age of the oldest stuck op when last seen.")
    e.sample("rankwatch_hang_age_seconds", {"job": j}, float(max(ages, default=0.0)))
    e.family(
        "rankwatch_findings_cost_seconds",
        "gauge",
        "Job time the current stragglers cost so far (what-if estimate).",
    )
    e.sample("rankwatch_findings_cost_seconds", {"job": j}, float(job["total_cost_s"]))


def _traffic(e: Exposition, j: str, traffic: Iterable[dict]) -> None:
    name = "rankwatch_collective_duration_seconds"
    e.family(name, "histogram", "Op execution time (GPU when timed), by op and size class.")
    bus = []
    payload = []
    for t in traffic:
        labels = {"job": j, "op": t["op"], "size_class": t["size_class"]}
        cumulative = 0
        for bound, n in zip(DURATION_BUCKETS_S, t["buckets"], strict=False):
            cumulative += n
            e.sample(f"{name}_bucket", {**labels, "le": _le(bound)}, cumulative, name)
        e.sample(f"{name}_bucket", {**labels, "le": "+Inf"}, t["count"], name)
        e.sample(f"{name}_sum", labels, t["duration_s"], name)
        e.sample(f"{name}_count", labels, t["count"], name)
        bus.append((labels, t["bus_bytes"]))
        payload.append((labels, t["payload_bytes"]))
    e.family(
        "rankwatch_collective_bus_bytes_total",
        "counter",
        "Bus bytes (payload x nccl-tests factor); rate() / rate(duration sum) is bus bandwidth.",
    )
    for labels, v in bus:
        e.sample("rankwatch_collective_bus_bytes_total", labels, v)
    e.family("rankwatch_collective_payload_bytes_total", "counter", "Message bytes of the ops.")
    for labels, v in payload:
        e.sample("rankwatch_collective_payload_bytes_total", labels, v)


def _le(bound: float) -> str:
    return repr(bound)
