"""The Perfetto timeline: written from a simulated job by `rankwatch analyze
--perfetto`, read back with the perfetto package's own protobuf classes, and
checked against the aligned tables it was drawn from.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rankwatch.align import align
from rankwatch.cli import main
from rankwatch.export.perfetto import write_perfetto
from rankwatch.simulate import SimConfig, simulate
from rankwatch.store import ingest

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

RANKS, HOSTS = 16, 2


@dataclass
class Slice:
    track: int
    name: str
    begin: int
    end: int
    args: dict[str, Any]
    flows: list[int]


@dataclass
class ParsedTrace:
    """A .pftrace file decoded: tracks by uuid, slices (begin/end paired per track)."""

    packets: list[Any]
    tracks: dict[int, Any] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    instants: list[Any] = field(default_factory=list)

    def threads(self) -> dict[int, Any]:
        return {u: t for u, t in self.tracks.items() if t.HasField("thread")}

    def rank_of(self, uuid: int) -> int:
        """World rank of a track: its own thread track, or the thread track it hangs off."""
        track = self.tracks[uuid]
        if not track.HasField("thread"):
            track = self.tracks[track.parent_uuid]
        return int(track.thread.thread_name.split()[1])

    def is_gpu(self, s: Slice) -> bool:
        track = self.tracks[s.track]
        return track.HasField("thread") or track.name.startswith("GPU overlap")

    def is_host(self, s: Slice) -> bool:
        return self.tracks[s.track].name.startswith("host enqueue")


def _value(ann: Any) -> Any:
    return getattr(ann, ann.WhichOneof("value"))


def parse(path: Path) -> ParsedTrace:
    trace = pb.Trace.FromString(path.read_bytes())
    parsed = ParsedTrace(list(trace.packet))
    open_slices: dict[int, list[Slice]] = defaultdict(list)
    for pkt in trace.packet:
        if pkt.HasField("track_descriptor"):
            parsed.tracks[pkt.track_descriptor.uuid] = pkt.track_descriptor
            continue
        ev = pkt.track_event
        assert ev.track_uuid in parsed.tracks, "event before its track's descriptor"
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {a.name: _value(a) for a in ev.debug_annotations}
            flows = list(ev.flow_ids) + list(ev.terminating_flow_ids)
            open_slices[ev.track_uuid].append(
                Slice(ev.track_uuid, ev.name, pkt.timestamp, -1, args, flows)
            )
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            done = open_slices[ev.track_uuid].pop()
            assert not open_slices[ev.track_uuid], "slices on one track must not nest"
            done.end = pkt.timestamp
            parsed.slices.append(done)
        else:
            parsed.instants.append(pkt)
    assert not any(open_slices.values()), "every slice must end"
    return parsed


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 ranks on 2 hosts with TP, PP (so P2P sends and receives) and DP communicators."""
    out = tmp_path_factory.mktemp("perfetto-job")
    cfg = SimConfig(
        ranks=RANKS, hosts=HOSTS, steps=12, tp=2, pp=2, seed=7, clock_offset_us=2000, drift_ppm=5
    )
    simulate(cfg, out)
    return out


@pytest.fixture(scope="module")
def run(job: Path):
    run = ingest([job], progress=False).run()
    align(run)
    return run


@pytest.fixture(scope="module")
def cli_trace(job: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("trace") / "job.pftrace"
    result = CliRunner().invoke(main, ["analyze", str(job), "--perfetto", str(path)])
    assert result.exit_code == 0, result.output
    return path, result.output


@pytest.fixture(scope="module")
def trace(cli_trace: tuple[Path, str]) -> ParsedTrace:
    return parse(cli_trace[0])


def _aligned(run, where: str, columns: str) -> list[tuple]:
    return [
        tuple(r)
        for r in run.con.execute(f"SELECT {columns} FROM ops_aligned WHERE {where}").fetchall()
    ]


def test_cli_writes_the_trace_and_names_it(cli_trace: tuple[Path, str]) -> None:
    path, output = cli_trace
    assert path.stat().st_size > 0
    assert f"Perfetto trace: {path}" in output
    assert not list(path.parent.glob(".*tmp*")), "the temporary file is renamed away"


def test_one_thread_track_per_rank_under_its_host(trace: ParsedTrace, run) -> None:
    threads = trace.threads()
    assert len(threads) == RANKS
    processes = {t.process.pid: t.process.process_name for t in trace.tracks.values()
                 if t.HasField("process")}  # fmt: skip
    assert len(processes) == HOSTS
    expected = {
        f"rank {w} ({h}, {p})": h
        for w, h, p in run.con.execute("SELECT world_rank, host, pid FROM processes").fetchall()
    }
    got = {t.thread.thread_name: processes[t.thread.pid] for t in threads.values()}
    assert got == expected


def test_gpu_slices_are_the_gpu_timed_ops_at_their_aligned_times(trace: ParsedTrace, run) -> None:
    gpu = [s for s in trace.slices if trace.is_gpu(s)]
    expected = _aligned(
        run,
        "gpu_start_c IS NOT NULL AND gpu_end_c IS NOT NULL",
        "world_rank, func, seq, gpu_start_c, gpu_end_c",
    )
    assert len(gpu) == len(expected) > 0
    got = [(trace.rank_of(s.track), s.name, s.args["seq"], s.begin, s.end) for s in gpu]
    assert Counter(got) == Counter(expected)
    sample = next(s for s in gpu if s.name == "AllReduce")
    assert {"seq", "size_bytes", "comm", "algo_proto", "busbw_gbs"} <= set(sample.args)
    assert sample.args["algo_proto"] == "RING/SIMPLE"


def test_host_slices_span_arrival_to_enqueue_end(trace: ParsedTrace, run) -> None:
    host = [s for s in trace.slices if trace.is_host(s)]
    expected = _aligned(run, "arrival_c IS NOT NULL", "world_rank, func, seq, arrival_c")
    assert len(host) == len(expected)
    got = [(trace.rank_of(s.track), s.name, s.args["seq"], s.begin) for s in host]
    assert Counter(got) == Counter(expected)
    assert all(s.end >= s.begin for s in host)


def test_packets_are_in_time_order(trace: ParsedTrace) -> None:
    stamps = [p.timestamp for p in trace.packets if p.HasField("track_event")]
    assert stamps == sorted(stamps)


def test_flows_link_every_rank_of_a_collective(trace: ParsedTrace, run) -> None:
    ranks_of = {
        (comm, func, seq): n
        for comm, func, seq, n in run.con.execute(
            "SELECT comm_id, func, seq, count(*) FROM ops_aligned WHERE kind = 'coll' GROUP BY ALL"
        ).fetchall()
    }
    flows: dict[tuple, set[int]] = defaultdict(set)
    carried: Counter[int] = Counter()
    for s in trace.slices:
        if s.name in ("Send", "Recv"):
            continue
        key = (s.args["comm"].split()[-1], s.name, s.args["seq"])
        flows[key].update(s.flows)
        carried.update(s.flows)
    multi = {k for k, n in ranks_of.items() if n > 1}
    assert multi and multi <= set(flows)
    for key in multi:
        assert len(flows[key]) == 1, key  # one flow per collective...
        assert carried[next(iter(flows[key]))] == ranks_of[key], key  # ...through all its ranks
    ids = [next(iter(flows[k])) for k in multi]
    assert len(set(ids)) == len(ids)


def test_a_send_and_its_receive_share_a_flow(trace: ParsedTrace, run) -> None:
    pairs = run.con.execute("SELECT count(*) FROM p2p_pairs").fetchall()[0][0]
    assert pairs > 0
    by_flow: dict[int, list[str]] = defaultdict(list)
    for s in trace.slices:
        if s.name in ("Send", "Recv"):
            for f in s.flows:
                by_flow[f].append(s.name)
    assert sum(sorted(v) == ["Recv", "Send"] for v in by_flow.values()) == pairs


def test_huge_jobs_are_downsampled_by_whole_collectives(run, tmp_path: Path) -> None:
    total = run.count("ops")
    result = write_perfetto(run, tmp_path / "small.pftrace", max_ops=total // 5)
    assert result.stride == 5 + (total % 5 > 0)
    assert 0 < result.ops_drawn < total // 4
    assert result.notes and "every" in result.notes[0]
    trace = parse(tmp_path / "small.pftrace")
    notes = [p for p in trace.instants if p.track_event.name == "note"]
    assert len(notes) == 1
    assert result.notes[0] == _value(notes[0].track_event.debug_annotations[0])
    # every kept collective still has all its ranks: flows are as long as n_ranks
    carried = Counter(f for s in trace.slices if s.name == "AllReduce" for f in s.flows)
    sizes = {n for (n,) in run.con.execute(
        "SELECT DISTINCT n_ranks FROM ops WHERE func = 'AllReduce'").fetchall()}  # fmt: skip
    assert carried and set(carried.values()) <= sizes


def test_overlapping_spans_go_to_separate_lanes() -> None:
    from rankwatch.export.perfetto import _lanes

    # Given GPU spans of two communicators that overlap on one rank
    spans = [(0, 10), (5, 8), (10, 20), (12, 13), (13, 30)]
    # Then a span shares a lane only with spans it does not overlap, earliest lane first
    assert _lanes(spans) == [0, 1, 0, 1, 1]


def test_the_cyclic_collector_is_paused_while_writing_and_restored(run, tmp_path: Path) -> None:
    import gc

    from rankwatch.export import perfetto

    seen: list[bool] = []
    real_emit = perfetto._emit

    def emit(*args: Any) -> None:
        seen.append(gc.isenabled())
        real_emit(*args)

    # Given a collector that is on, then one that is off
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            perfetto._emit = emit
            write_perfetto(run, tmp_path / "t.pftrace")
            # Then it was paused while the trace was built, and is as it was after
            assert seen.pop() is False
            assert gc.isenabled() is enabled
            # also when writing fails
            with pytest.raises(OSError):
                write_perfetto(run, tmp_path / "missing-dir" / "t.pftrace")
            assert gc.isenabled() is enabled
        finally:
            perfetto._emit = real_emit
            gc.enable()
