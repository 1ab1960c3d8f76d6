"""The HTML report: one self-contained file that names the late rank, draws in a
real headless Chromium, and says what it cannot show instead of failing.

Everything is real: a simulated job's record files, `rankwatch analyze --html`
through the CLI, and Debian's chromium (tests that need it skip when it is not
installed; .ci/run installs it).
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from rankwatch.cli import main
from rankwatch.simulate import SimConfig, SlowFault, simulate

SLOW_RANK = 5
SLOW_FROM_STEP = 30
STEPS = 60
# AllReduce on the world communicator, AllReduce on the other communicators,
# the lateness heatmap, bandwidth, clock offsets.
FIGURES = 5
SIZE_LIMIT = 6_000_000  # plotly.js inlined once is about 4.8 MB; the data stay small
SECTIONS = ("summary", "timelines", "lateness", "bandwidth", "clocks", "findings", "problems")
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
    "--virtual-time-budget=10000",
)  # fmt: skip
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)"
)


def analyze_html(records: Path, out: Path) -> str:
    result = CliRunner().invoke(main, ["analyze", str(records), "--html", str(out)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 ranks on 2 hosts (TP 2 x DP 4); rank 5's GPU turns slow halfway."""
    out = tmp_path_factory.mktemp("slow-job")
    slow = SlowFault(SLOW_RANK, SLOW_FROM_STEP, "gpu", 2000.0)
    cfg = SimConfig(ranks=8, hosts=2, tp=2, steps=STEPS, clock_offset_us=300, slow=slow, seed=3)
    simulate(cfg, out)
    return out


@pytest.fixture(scope="module")
def report(slow_job: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    output = analyze_html(slow_job, path)
    assert f"HTML report: {path}" in output
    return path


def section(html: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', html, re.S)
    assert match, f"no section {name}"
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(1))))


def chromium(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run([*cmd, page.as_uri()], capture_output=True, text=True, timeout=120)


def test_report_is_one_file_that_loads_nothing_from_elsewhere(report: Path) -> None:
    html = report.read_text(encoding="utf-8")
    assert html.count("* plotly.js v") == 1  # plotly.js inlined exactly once
    markup = re.sub(r"<script>.*?</script>", "<script></script>", html, flags=re.S)
    loads = re.findall(r"<(?:script|link|img|iframe|object|embed)\b[^>]*\b(?:src|href)=", markup)
    assert loads == []
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", markup, re.I)
    assert report.stat().st_size < SIZE_LIMIT


def test_report_has_every_section_and_one_plot_div_per_figure(report: Path) -> None:
    html = report.read_text(encoding="utf-8")
    for name in SECTIONS:
        assert f'<section id="{name}">' in html
    assert f'<meta name="rankwatch-figures" content="{FIGURES}">' in html
    assert html.count('class="plotly-graph-div"') == FIGURES
    assert "AllReduce on the world communicator" in section(html, "timelines")
    assert "AllReduce on the other 6 communicators" in section(html, "timelines")
    findings = section(html, "findings")
    assert "straggler" in findings and f"straggler {SLOW_RANK} sim-node001" in findings
    # where and by which rule it was confirmed (here at its second late step, with how
    # many such pairs chance would make)
    assert re.search(r"AllReduce #\d+, after 2 late steps", findings), findings
    assert "chance_pairs_expected" in findings
    assert "None: every line read was a good record." in section(html, "problems")


def test_summary_names_the_slow_rank_and_when_it_turned_slow(report: Path) -> None:
    summary = section(report.read_text(encoding="utf-8"), "summary")
    # The detectors' finding leads the summary: who, since when, why
    assert f"Rank {SLOW_RANK} (host sim-node001) is a straggler since" in summary
    assert "cause: gpu" in summary
    began = float(re.search(r"is a straggler since ([\d.]+) s into the job", summary).group(1))
    span = float(re.search(r"over ([\d.]+) s", summary).group(1))
    assert 0.4 * span < began < 0.6 * span  # the fault starts at step 30 of 60
    assert "8 ranks in 8 process(es) on 2 host(s)" in summary


@needs_chromium
def test_report_draws_every_figure_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    done = chromium(report, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    plotted = re.findall(r'<div id="fig-[^"]*" class="[^"]*\bjs-plotly-plot\b', dom)
    assert len(plotted) == FIGURES  # Plotly.newPlot ran for every figure
    assert dom.count('class="main-svg"') >= FIGURES
    assert re.search(r'<div id="render-errors" hidden=""></div>', dom), "page reported errors"
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console


@needs_chromium
def test_report_screenshot_is_taken(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    done = chromium(report, tmp_path, f"--screenshot={shot}", "--window-size=1300,3000")
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # text and plots, not a blank page


def test_inspector_logs_without_timestamps_give_a_report_that_says_so(
    tmp_path: Path,
) -> None:
    # Given NCCL Inspector records: the simulated job's op lines without the rankwatch
    # object (so no timestamps), and no state files
    sim, inspector = tmp_path / "sim", tmp_path / "inspector"
    simulate(SimConfig(ranks=4, hosts=2, steps=10, seed=1), sim)
    inspector.mkdir()
    for log in sim.glob("*.log"):
        lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
        lines = [{k: v for k, v in rec.items() if k != "rankwatch"} for rec in lines]
        (inspector / log.name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    # When the report is written
    out = tmp_path / "inspector.html"
    analyze_html(inspector, out)
    # Then it explains what is missing instead of drawing timelines
    html = out.read_text(encoding="utf-8")
    assert "the records carry no timestamps" in section(html, "summary")
    assert "Which rank is late cannot be told" in section(html, "summary")
    assert "Not available" in section(html, "timelines")
    assert "Not available" in section(html, "lateness")
    assert "fig-timeline" not in html and "fig-lateness-heatmap" not in html
    assert "records' own bus bandwidths" in section(html, "bandwidth")
    assert html.count('class="plotly-graph-div"') == 1  # bandwidth only


def test_demo_writes_the_report_next_to_its_records(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--out", str(out), "--steps", "10"])
    assert result.exit_code == 0, result.output
    report = out / "report.html"
    assert f"HTML report: {report}" in result.output
    html = report.read_text(encoding="utf-8")  # which rank is late depends on timing here
    assert "4 ranks in 4 process(es) on 1 host(s)" in section(html, "summary")
    assert 'id="fig-timeline-0"' in html


def test_every_figure_draws_trace_types_its_template_has(report: Path) -> None:
    """The figures' template keeps the defaults of TRACE_TYPES only (html_figures:
    assigning the whole one took 40 ms a figure): every trace drawn is of those, and
    the template's layout is the whole one's."""
    import plotly.io as pio

    from rankwatch.export.html_figures import TEMPLATE, TRACE_TYPES, template

    html = report.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    drawn = []
    for call in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', html):
        traces, _ = decoder.raw_decode(html, call.end())
        drawn += [trace.get("type", "scatter") for trace in traces]
    assert len(drawn) > FIGURES and set(drawn) <= set(TRACE_TYPES), set(drawn)
    assert template().layout == pio.templates[TEMPLATE].layout
