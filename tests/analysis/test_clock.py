"""rankwatch.align.clock: host clock offsets and drift, estimated in-band from
the collectives, with error bounds that hold."""

from __future__ import annotations

from analysis_support import truth

from rankwatch.align import align, clock
from rankwatch.align.clock import _intervals, _least_squares
from rankwatch.store import ingest


def true_offset(t: dict, host: str, ref: str, at_ns: int) -> float:
    """Simulated offset of host against ref at (approximately) true time at_ns."""
    hosts = {h["host"]: h for h in t["hosts"]}
    since = at_ns - t["job"]["start_ns"]

    def off(h: dict) -> float:
        return h["offset_ns"] + h["drift_ppm"] * 1e-6 * since

    return off(hosts[host]) - off(hosts[ref])


def test_offsets_and_drift_are_recovered_within_their_bounds(sim) -> None:
    # Given 16 hosts whose clocks are off by up to 5 ms and drift by up to 10 ppm
    directory = sim("clocks")
    t = truth(directory)
    # When the clocks are estimated from the collectives
    run = ingest([directory], progress=False).run()
    clock = align(run)
    # Then every host is aligned to within 5 us, at the start, middle and end of the run
    span = run.con.execute("SELECT min(gpu_start_ns), max(gpu_end_ns) FROM ops").fetchall()[0]
    inside = 0
    for h in clock.hosts:
        for at in (span[0], clock.t0_ns, span[1]):
            estimate = h.offset_ns + h.drift_ppm * 1e-6 * (at - clock.t0_ns)
            error = abs(estimate - true_offset(t, h.host, clock.reference, at))
            assert error < 5_000, (h.host, at, error)
        error_t0 = abs(h.offset_ns - true_offset(t, h.host, clock.reference, clock.t0_ns))
        inside += h.bound_ns is not None and error_t0 <= h.bound_ns
    # And the truth lies inside the reported bound for at least 95% of hosts
    assert inside >= 0.95 * len(clock.hosts)
    assert clock.consistent and clock.max_bound_ns is not None
    # And the estimate is stored for SQL, with the bound exposed to every op
    assert run.count("host_clock") == 16
    assert (
        run.con.execute("SELECT count(*) FROM ops_aligned WHERE clock_bound_ns IS NULL").fetchall()[
            0
        ][0]
        == 0
    )


def test_corrected_times_put_collective_ends_together(sim) -> None:
    # Given a job with skewed host clocks
    run = ingest([sim("clocks")], progress=False).run()
    raw_spread = run.con.execute(
        "SELECT median(mx - mn) FROM (SELECT max(gpu_end_ns) - min(gpu_end_ns) AS mx, 0 AS mn "
        "FROM ops WHERE kind = 'coll' GROUP BY comm_key, func, seq)"
    ).fetchall()[0][0]
    # When aligned
    align(run)
    fixed_spread = run.con.execute(
        "SELECT median(last_gpu_end - first_gpu_end) FROM collectives"
    ).fetchall()[0][0]
    # Then a collective's end times agree across hosts to microseconds, not milliseconds
    assert raw_spread > 1_000_000
    assert fixed_spread < 10_000


def test_one_host_needs_no_alignment(sim) -> None:
    run = ingest([sim("desync")], progress=False).run()
    clock = align(run)
    assert [(h.method, h.bound_ns) for h in clock.hosts] == [("single_host", 0.0)]


def test_feasible_intervals_come_from_the_tightest_chain_of_constraints() -> None:
    # Given difference bounds a-b in [1, 3], b-c in [2, 5] and a direct a-c in [4, 6]
    bounds = {("a", "b"): (1.0, 3.0), ("b", "c"): (2.0, 5.0), ("a", "c"): (4.0, 6.0)}
    # When intervals against reference c are solved
    intervals, consistent = _intervals(bounds, ["a", "b", "c"], "c")
    # Then a-c is [4, 6] (direct beats the chain [3, 8]) and b-c is [2, 5]
    assert consistent
    assert intervals["a"] == (4.0, 6.0)
    assert intervals["b"] == (2.0, 5.0)
    # And contradictory bounds are flagged
    _, consistent = _intervals({("a", "b"): (5.0, 6.0), ("b", "a"): (5.0, 6.0)}, ["a", "b"], "b")
    assert not consistent


def test_least_squares_solves_pair_differences_against_the_reference() -> None:
    values = {("a", "b"): 2.0, ("b", "c"): 3.0, ("a", "c"): 5.0}
    weights = dict.fromkeys(values, 1.0)
    x = _least_squares(values, weights, "c")
    assert abs(x["a"] - 5.0) < 1e-9 and abs(x["b"] - 3.0) < 1e-9 and x["c"] == 0.0


def test_many_hosts_solve_as_the_dense_forms_do(monkeypatch) -> None:
    """Above MAX_ALL_PAIRS_HOSTS the intervals come from Bellman-Ford from and to the
    reference and the offsets from the pairs' weighted Laplacian (the dense forms
    grow with the cube of the hosts): on ring-and-star pairs of 33 to 90 hosts, some
    left out, some contradicting the others, the same intervals, consistency and
    offsets as Floyd-Warshall and lstsq give."""
    import random

    rng = random.Random(5)
    contradicted = 0
    for trial in range(30):
        hosts = [f"h{i:03d}" for i in range(rng.randint(clock.MAX_ALL_PAIRS_HOSTS + 1, 90))]
        truth_ns = {h: rng.uniform(-5e6, 5e6) for h in hosts}
        ref = rng.choice(hosts)
        pairs = clock._allowed_pairs(hosts, ref)
        bounds = {}
        for a, b in rng.sample(pairs, int(len(pairs) * rng.uniform(0.6, 1.0))):
            d = truth_ns[a] - truth_ns[b]
            bounds[(a, b)] = (d - rng.uniform(1, 5000), d + rng.uniform(1, 5000))
            if trial % 4 == 3 and rng.random() < 0.05:  # a bound that did not hold
                bounds[(a, b)] = (d + 9000, d + 9500)
        values = {p: truth_ns[p[0]] - truth_ns[p[1]] + rng.uniform(-100, 100) for p in bounds}
        weights = {p: rng.uniform(0.1, 10) for p in bounds}
        sparse = _intervals(bounds, hosts, ref), _least_squares(values, weights, ref)
        with monkeypatch.context() as m:
            m.setattr(clock, "MAX_ALL_PAIRS_HOSTS", len(hosts))
            dense = _intervals(bounds, hosts, ref), _least_squares(values, weights, ref)
        (got, got_ok), got_x = sparse
        (want, want_ok), want_x = dense
        assert got_ok == want_ok
        contradicted += not want_ok
        if want_ok:
            assert got.keys() == want.keys() and len(want) > 1
            for h, (lo, hi) in want.items():
                assert abs(got[h][0] - lo) < 1e-3 and abs(got[h][1] - hi) < 1e-3, h
        assert got_x.keys() == want_x.keys()
        assert max(abs(got_x[h] - want_x[h]) for h in want_x) < 1e-3
    assert 0 < contradicted < 30
