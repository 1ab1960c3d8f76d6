"""`rankwatch analyze` and `rankwatch simulate`, run as a user runs them."""

from __future__ import annotations

import json

from analysis_support import first_op_lines, run_cli, truth, write_lines


def test_analyze_json_has_the_required_keys(sim) -> None:
    # Given a simulated job with a late host
    directory = sim("slow_host")
    # When analysed with --json
    result = run_cli("analyze", "--json", str(directory))
    # Then one JSON object comes out with job, ranks, communicators, clock, findings
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for key in ("job", "ranks", "communicators", "clock", "findings", "problems"):
        assert key in summary, key
    # and the detectors name the injected host straggler (rank 5 from step 40)
    assert [(f["kind"], f["rank"], f["cause"]) for f in summary["findings"]] == [
        ("straggler", 5, "host")
    ]
    assert summary["problems"] == []
    assert summary["job"]["ranks"] == len(summary["ranks"]) == 8
    assert summary["job"]["op_records"] == truth(directory)["records"]["ops"]
    # And the clock carries offsets with bounds, and the late rank is named
    assert all(h["bound_ns"] is not None for h in summary["clock"]["hosts"])
    assert summary["late_ranks"][0]["world_rank"] == truth(directory)["faults"][0]["rank"]


def test_detector_thresholds_are_set_from_the_command_line(sim, tmp_path) -> None:
    # Given the job whose host straggler the defaults find (the test above)
    directory = sim("slow_host")
    # When analysed with thresholds no straggler of a few milliseconds can reach
    html = tmp_path / "report.html"
    settings = ("z_hit=1e6", "cusum_h=1e9", "chance_runs=0")
    args = [a for s in settings for a in ("--detect", s)]
    result = run_cli("analyze", "--json", str(directory), "--html", str(html), *args)
    # Then it is not reported, and the output says what the detectors ran with
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert [f for f in summary["findings"] if f["kind"] == "straggler"] == []
    assert summary["detect_config"] == {"z_hit": 1e6, "cusum_h": 1e9, "chance_runs": 0.0}
    assert "z_hit=1000000.0, chance_runs=0.0, cusum_h=1000000000.0" in html.read_text()
    # and a default run says it changed nothing
    assert json.loads(run_cli("analyze", "--json", str(directory)).stdout)["detect_config"] == {}


def test_a_bad_detector_setting_is_named(sim) -> None:
    directory = str(sim("slow_host"))
    for setting, says in (("z_hits=8", "'z_hits' is not a detector setting (chance_runs,"),
                          ("persist=2.5", "persist='2.5': expected an integer"),
                          ("learn=0", "learn='0': expected a value from 1 to 64"),
                          ("persist_ops=0", "persist_ops='0': expected a value from 1 to"),
                          ("cusum_h=inf", "cusum_h='inf': expected a value from 1e-09 to 1e+18"),
                          ("z_hit", "expected NAME=VALUE")):  # fmt: skip
        result = run_cli("analyze", directory, "--detect", setting)
        assert result.returncode == 2 and "--detect" in result.stderr, result.stderr
        assert says in result.stderr, result.stderr


def test_analyze_text_summarises_in_plain_language(sim) -> None:
    result = run_cli("analyze", "--quiet", str(sim("slow_host")))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for phrase in (
        "Job sim:",
        "Ranks: 8 in 8 processes on 2 host(s)",
        "Communicators:",
        "Clocks: offsets against",
        "Most-late ranks",
        "rank 5 (",
        "Problems while reading: none.",
    ):
        assert phrase in text, phrase
    assert result.stderr == ""


def test_problems_are_reported_but_usable_records_exit_zero(sim, tmp_path) -> None:
    # Given a directory where one file has a malformed line
    good = first_op_lines(sim("plain"), 5)
    path = write_lines(tmp_path / "h-pid1.log", good[:2] + ["{nope"] + good[2:])
    # When analysed
    result = run_cli("analyze", "--json", str(tmp_path))
    # Then the problem is reported with file and line, and the exit code is 0
    assert result.returncode == 0, result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert [(p["file"], p["line"], p["kind"]) for p in problems] == [
        (str(path), 3, "malformed_json")
    ]


def test_nothing_usable_is_a_nonzero_exit(tmp_path) -> None:
    # Given only broken records, and separately no records at all
    write_lines(tmp_path / "bad/h-pid1.log", ["{nope", "[1, 2]"])
    (tmp_path / "empty").mkdir()
    for directory in (tmp_path / "bad", tmp_path / "empty"):
        # When analysed
        result = run_cli("analyze", str(directory))
        # Then the exit code is non-zero and the message says why
        assert result.returncode != 0
        assert "nothing usable" in result.stderr


def test_simulate_writes_records_and_truth(tmp_path) -> None:
    out = tmp_path / "job"
    result = run_cli(
        "simulate",
        "--ranks",
        "4",
        "--hosts",
        "2",
        "--steps",
        "5",
        "--slow-rank",
        "1",
        "--slow-from-step",
        "2",
        "--slow-cause",
        "gpu",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "op records" in result.stdout
    t = truth(out)
    assert t["faults"][0]["cause"] == "gpu"
    assert len(list(out.glob("*-pid*.log"))) == 4


def test_simulate_rejects_a_fault_without_its_step(tmp_path) -> None:
    result = run_cli("simulate", "--ranks", "4", "--hang-rank", "1", str(tmp_path / "x"))
    assert result.returncode == 2
    assert "--hang-rank needs its step option" in result.stderr


def test_every_detector_setting_is_documented_with_its_default() -> None:
    """docs/detection.md's settings table lists each Config field and its default."""
    import dataclasses
    import re
    from pathlib import Path

    from rankwatch.detect import Config

    doc = (Path(__file__).resolve().parents[2] / "docs" / "detection.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", doc, flags=re.M))
    fields = {f.name: getattr(Config(), f.name) for f in dataclasses.fields(Config)}
    assert set(rows) == set(fields)
    for name, default in fields.items():
        assert float(rows[name]) == default, name
