"""The plain-language part of the HTML report: who is late, the job, what is missing.

Every function takes plain data (the analysis summary, counts, an Onset) and
returns sentences; the template escapes and lays them out.
"""

from __future__ import annotations

from typing import Any

from rankwatch.export.html_onset import Onset

MEASURES = {
    "gpu_start": (
        "the last to start on the GPU",
        "times_last_gpu_start",
        "gpu_lag_caused_ns",
        "mean_last_gpu_lag_ns",
        "significant_last_gpu_starts",
        "started",
    ),
    "arrival": (
        "the last to call",
        "times_last_arrival",
        "arrival_lag_caused_ns",
        "mean_last_arrival_lag_ns",
        "significant_last_arrivals",
        "called",
    ),
}


def duration(ns: float | None) -> str:
    """A duration in the unit that reads best: 812 us, 1.06 ms, 2.35 s."""
    if ns is None:
        return "unknown"
    a = abs(ns)
    if a < 1e3:
        return f"{ns:,.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:,.3g} µs" if a < 1e5 else f"{ns / 1e3:,.0f} µs"
    if a < 1e9:
        return f"{ns / 1e6:,.3g} ms" if a < 1e8 else f"{ns / 1e6:,.0f} ms"
    return f"{ns / 1e9:,.3g} s" if a < 1e11 else f"{ns / 1e9:,.0f} s"


def measure_of(rank: dict[str, Any]) -> str:
    """gpu_start when the rank caused more lag by starting late on the GPU, else arrival."""
    gpu, arr = rank.get("gpu_lag_caused_ns") or 0, rank.get("arrival_lag_caused_ns") or 0
    return "gpu_start" if gpu >= arr else "arrival"


def headline(summary: dict[str, Any], onset: Onset | None, t0: int | None) -> list[str]:
    """Sentences naming the late rank, by how much and since when (t0 None: the records
    have no timestamps)."""
    stragglers = [f for f in summary.get("findings", []) if f.get("kind") == "straggler"]
    if stragglers:
        return [_finding_sentence(f, t0) for f in stragglers]
    late = summary.get("late_ranks") or []
    if not summary["job"]["op_records"]:
        return ["The records hold no ops (only state records), so no rank can be compared."]
    if not late and t0 is None:
        return [
            "Which rank is late cannot be told: the records carry no timestamps, so the "
            "ranks cannot be compared in time."
        ]
    if not late:
        return [
            "No rank stands out: no rank was ever later than its peers in a collective "
            "that more than one rank recorded."
        ]
    top = late[0]
    sentences = [_late_sentence(top, summary), *_onset_sentences(onset)]
    caveat = _clock_caveat(top, summary)
    if caveat:
        sentences.append(caveat)
    if len(late) > 1:
        others = ", ".join(f"rank {r['world_rank']} ({duration(_caused(r))})" for r in late[1:4])
        sentences.append(f"Next most late, by lag caused: {others}.")
    return sentences


def _caused(rank: dict[str, Any]) -> float:
    return max(rank.get("gpu_lag_caused_ns") or 0, rank.get("arrival_lag_caused_ns") or 0)


def _late_sentence(r: dict[str, Any], summary: dict[str, Any]) -> str:
    what, times, caused, mean, _, _ = MEASURES[measure_of(r)]
    seen = next((x["ops"] for x in summary["ranks"] if x["world_rank"] == r["world_rank"]), None)
    out_of = "collectives" if seen is None else f"of the {seen:,} ops it recorded"
    return (
        f"Rank {r['world_rank']} (host {r['host']}) is the most late rank: it was {what} "
        f"in {r[times]:,} {out_of}, {duration(r[mean])} after the next-latest "
        f"rank on average ({duration(r[caused])} of waiting caused in all)."
    )


def _onset_sentences(onset: Onset | None) -> list[str]:
    if onset is None:
        return []
    verb = MEASURES[onset.measure][5]
    if onset.time_s is None:
        return [
            f"It was late throughout the recording: it {verb} on average "
            f"{duration(onset.after_ns)} after the median rank."
        ]
    where = f"{onset.func} #{onset.seq}" + (f" on {onset.comm_name}" if onset.comm_name else "")
    return [
        f"This began about {onset.time_s:,.2f} s into the job ({where}): from then on it "
        f"{verb} on average {duration(onset.after_ns)} after the median rank, against "
        f"{duration(onset.before_ns)} before."
    ]


def _clock_caveat(r: dict[str, Any], summary: dict[str, Any]) -> str | None:
    significant = r.get(MEASURES[measure_of(r)][4])
    bound = summary["clock"].get("max_bound_ns")
    if bound is None and len(summary["clock"]["hosts"]) > 1:
        return (
            "Some host clocks could not be aligned, so comparisons between ranks on "
            "different hosts are not reliable."
        )
    if significant or not bound:
        return None
    return (
        f"All of these lags are within the clock uncertainty between hosts "
        f"(±{duration(2 * bound)}), so they are not evidence of lateness."
    )


def _finding_sentence(f: dict[str, Any], t0: int | None) -> str:
    since = f.get("since") or {}
    when = ""
    if since.get("ns") is not None and t0 is not None:
        when = f" since {(since['ns'] - t0) / 1e9:,.2f} s into the job"
    elif since.get("seq") is not None:
        when = f" since op #{since['seq']}"
    cause = f", cause: {f['cause']}" if f.get("cause") else ""
    cost = f", about {f['cost_s']:,.3g} s of job time lost" if f.get("cost_s") else ""
    return f"Rank {f.get('rank')} (host {f.get('host')}) is a straggler{when}{cause}{cost}."


def facts(summary: dict[str, Any], t0: int | None) -> list[str]:
    """The job in a few sentences: records, ranks and hosts, communicators, clocks."""
    job = summary["job"]
    ids = ", ".join(job["job_ids"]) or "unknown"
    span = "" if job["time_span_s"] is None else f" over {job['time_span_s']:,.1f} s"
    start = "" if t0 is None else f", starting {_utc(t0)} (reference clock)"
    comms = summary["communicators"]
    world = job.get("world_comm")
    world_text = (
        ""
        if not world
        else (
            f"; the world communicator is {world['name'] or 'unnamed'} ({world['n_ranks']} ranks "
            f"on {world['nnodes']} node(s))"
        )
    )
    funcs = ", ".join(f"{f} {n:,}" for f, n in summary["ops_per_func"].items()) or "none"
    return [
        f"Job {ids}: {job['op_records']:,} op records from {job['files']} file(s){span}{start}.",
        f"{job['ranks']} ranks in {job.get('processes', job['ranks'])} process(es) on "
        f"{job['hosts']} host(s); "
        f"{len(comms)} communicator(s){world_text}.",
        f"Ops per function: {funcs}.",
        _clock_fact(summary["clock"]),
    ]


def _utc(ns: int) -> str:
    import datetime as dt

    when = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _clock_fact(clock: dict[str, Any]) -> str:
    hosts = clock["hosts"]
    if len(hosts) <= 1:
        return "Clocks: one host, so no alignment between hosts is needed."
    unaligned = [h["host"] for h in hosts if h["bound_ns"] is None]
    text = (
        f"Clocks: {len(hosts)} hosts aligned in-band against {clock['reference']}; "
        f"the largest uncertainty is ±{duration(clock['max_bound_ns'] or 0)}."
    )
    if unaligned:
        text = (
            f"Clocks: {len(unaligned)} of {len(hosts)} hosts could not be aligned "
            f"({', '.join(unaligned[:5])}); their times are not comparable with the others."
        )
    return text


def lacks(gaps: dict[str, int], summary: dict[str, Any]) -> list[str]:
    """What the records do not tell, and what the report leaves out because of it."""
    out = []
    ops, untimed, colls = gaps["ops"], gaps["untimed"], gaps["colls"]
    if ops and untimed == ops:
        out.append(
            "The records carry no timestamps (NCCL Inspector logs written without event "
            "traces), so ranks cannot be lined up in time: the per-rank timelines and the "
            "lateness heatmap are not available, and bandwidth is the records' own figure."
        )
    elif untimed:
        out.append(
            f"{untimed:,} of {ops:,} op records carry no timestamps (Inspector logs "
            "without event traces); the timelines leave them out."
        )
    if not ops:
        out.append("There are no op records, only state records: nothing to compare or draw.")
    timed_colls = colls - min(untimed, colls)
    if timed_colls and gaps["no_gpu_start"] >= timed_colls:
        out.append(
            "No collective record has a GPU start time (GPU timing off, or every start "
            "stale): the GPU rows of the timelines are empty, and bandwidth is the records' "
            "own figure."
        )
    elif gaps["no_gpu_start"] and timed_colls:
        out.append(
            f"{gaps['no_gpu_start']:,} of {colls:,} collective records have no GPU start time "
            f"(GPU timing off or sampled, or a stale start: {gaps['stale']:,}); the GPU rows "
            "of the timelines show only the timed ops."
        )
    return out + _loss_lines(gaps, summary)


def _loss_lines(gaps: dict[str, int], summary: dict[str, Any]) -> list[str]:
    out = []
    if gaps["incomplete"]:
        out.append(
            f"{gaps['incomplete']:,} ops were written before they finished (the job "
            "or communicator ended first)."
        )
    if gaps["dropped"]:
        out.append(
            f"{gaps['dropped']:,} ops were not recorded (the plugin's slot pool was "
            "full, or Inspector dropped them)."
        )
    problems = sum(1 + p["repeats"] for p in summary["problems"])
    if problems:
        out.append(f"{problems:,} problem(s) while reading the files; see the last section.")
    return out
