"""Collectives matched across ranks and checked; clock offsets recovered in-band."""

from __future__ import annotations

from explain_support import CASES

from rankwatch.explain import collectives


def test_collectives_match_by_seq_when_traces_carry_it(analysed, traces) -> None:
    a = analysed("faulty")
    truth = traces("faulty")[1]
    assert a.table.method == {"0": "Seq"}
    assert len(a.table.colls) == len(truth["collectives"])
    assert a.table.mismatches == [] and a.table.incomplete == []
    by_seq = {c.key[2]: c for c in a.table.colls}
    for t in truth["collectives"]:
        c = by_seq[t["seq"]]
        assert set(c.ops) == {0, 1, 2, 3}
        if max(t["waits_ns"]) > 1e6:  # a clear last rank: the split names it
            assert c.last_rank == t["last_rank"]
            assert abs(c.transfer_ns - t["transfer_ns"]) < 20_000


def test_collectives_match_by_order_without_seq_and_report_disagreement(analysed) -> None:
    a = analysed("mismatch")
    assert a.table.method == {"0": "order within step"}
    [m] = a.table.mismatches
    assert m["step"] == 7 and list(m["ranks"]) == ["2"]
    assert m["fields"] == ["in_nelems", "out_nelems"]
    assert m["ranks"]["2"]["in_nelems"] * 2 == m["expected"]["in_nelems"]
    assert collectives.summary(a.table)["mismatches"] == 1


def test_old_traces_match_by_kernel_name_and_order(analysed) -> None:
    a = analysed("v1_13")
    assert a.table.method == {"default": "order within step"}
    assert all(len(c.ops) == 2 for c in a.table.colls)
    assert any("carry no collective args" in n for n in a.table.notes)


def test_clock_offsets_are_recovered_within_their_bounds(analysed, traces) -> None:
    a = analysed("faulty")
    truth = traces("faulty")[1]["offsets_ns"]
    assert a.clock.reference == "node00" and a.clock.consistent
    for rank, c in a.clock.ranks.items():
        err = abs(c.offset_ns - (truth[rank] - truth[0]))
        assert c.bound_ns is not None and err <= c.bound_ns, (rank, err, c.bound_ns)
        assert err < 50_000, (rank, err)  # end-synchrony pins them far tighter than the bound
    assert 0.0 <= a.clock.ordered_fraction <= 1.0


def test_ranks_on_one_host_share_one_clock(traces, tmp_path) -> None:
    from rankwatch.explain.analysis import TraceOptions, analyze
    from rankwatch.explain.synth import SynthConfig
    from rankwatch.explain.synth_files import generate

    cfg = SynthConfig(ranks=2, steps=6, layers=2, ranks_per_host=2)
    generate(cfg, tmp_path, "v2_11")
    a = analyze([tmp_path], TraceOptions(jobs=1))
    assert {c.domain for c in a.clock.ranks.values()} == {"node00"}
    assert any("share one host clock" in n for n in a.clock.notes)


def test_cpu_only_collectives_are_split_too(analysed) -> None:
    a = analysed("cpu")
    assert a.table.colls and all(c.transfer_ns is not None for c in a.table.colls)
    assert CASES["cpu"][0].mode == "cpu"


def test_a_clock_estimation_failure_is_reported_not_fatal(traces, monkeypatch) -> None:
    import rankwatch.explain.analysis as analysis

    def broken(*_args: object) -> None:
        raise ValueError("singular matrix")

    monkeypatch.setattr(analysis, "estimate", broken)
    a = analysis.analyze([traces("v2_11")[0]], analysis.TraceOptions(jobs=1))
    assert a.clock.ranks == {} and "singular matrix" in a.clock.notes[0]
    assert any(p.kind == "internal" and "clock" in p.message for p in a.loaded.problems)
    assert a.ledger.rows and a.findings
