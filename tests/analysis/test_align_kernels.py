"""The compiled alignment (native/rwalign.c through rankwatch.align.kernels), run
over the collective columns the native reader keeps while parsing
(rankwatch.store.captured), gives the tables the SQL form gives: `collectives`
value for value and `rank_lateness` (its means to rounding), on random records
full of NULLs and ties, on simulated jobs aligned in several passes, with host
clocks missing and world ranks unknown; it stands aside (the SQL form runs) when
some ops came through another reader, and when an int64 result overflows (the SQL
form's error, not a wrong number). The kernels also run under ASan and UBSan."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from helpers import NATIVE_DIR, build_sanitized, c_compiler, chunk_rows_default, run_sanitized
from rankwatch.align import align, collectives, kernels
from rankwatch.align.clock import HOST_CLOCK_COLUMNS, HostClock, estimate_clocks
from rankwatch.model import Run
from rankwatch.simulate import SimConfig, simulate
from rankwatch.store import captured, ingest, native

pytestmark = pytest.mark.skipif(
    kernels.library() is None or not native.available(), reason="native libraries not built"
)

TABLES = ("collectives", "rank_lateness")


def _rows(run: Run, table: str) -> list[tuple]:
    return run.con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def _align_both(run: Run, kept: captured.CollectiveColumns) -> dict[str, dict[str, list]]:
    """Each table as the SQL form and as the compiled form make it (same types)."""
    out: dict[str, dict[str, list]] = {}
    for mode in ("sql", "native"):
        if mode == "native":
            run.meta["collectives_kept"] = kept
        collectives.align_collectives(run)
        assert "collectives_kept" not in run.meta  # used once, then released
        out[mode] = {t: _rows(run, t) for t in TABLES}
        out[mode + " types"] = {t: run.con.sql(f"SELECT * FROM {t}").types for t in TABLES}
    assert out["sql types"] == out["native types"]
    return out


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):  # means of doubles: summed in another order
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return a == b


def _assert_same(tables: dict[str, dict[str, list]]) -> None:
    sql, native_ = tables["sql"], tables["native"]
    assert sql["collectives"] == native_["collectives"]  # exact, NULLs and doubles included
    assert len(sql["rank_lateness"]) == len(native_["rank_lateness"])
    for a, b in zip(sql["rank_lateness"], native_["rank_lateness"], strict=True):
        assert all(_close(x, y) for x, y in zip(a, b, strict=True)), (a, b)


def _ingested(path: Path) -> tuple[Run, captured.CollectiveColumns]:
    store = ingest([path], progress=False)
    kept = store.collectives_kept
    assert kept is not None
    run = store.run()
    assert store.collectives_kept is None and run.meta["collectives_kept"] is kept  # handed over
    align(run)  # ranks, clocks (and a first alignment, which releases the kept columns)
    assert "collectives_kept" not in run.meta
    return run, kept


# ---------------------------------------------------------------- random jobs

HOSTS = ["h0", "h1", "h2", "hé"]


def _record(rng: random.Random, host: str, pid: int, rank: int) -> dict:
    def maybe(value: object, p: float = 0.17) -> object:
        return None if rng.random() < p else value

    comm = rng.choice(["0x0a", "0x00b", "0xB"])  # 0x00b and 0xB: one comm_key, two ids
    base = 1_000_000 + rng.randrange(5) * 100
    kind = rng.choice(["coll"] * 9 + ["p2p"])
    func = rng.choice(["AllReduce", "AllGather"] if kind == "coll" else ["Send", "Recv"])
    seq = rng.randrange(-3, 40) if kind == "coll" else rng.randrange(40)
    perf = (
        {"coll_perf": {"coll": func, "coll_sn": seq}}
        if kind == "coll"
        else {"p2p_perf": {"p2p": func, "p2p_sn": seq, "p2p_peer": 0}}
    )
    return {
        "header": {"id": comm, "comm_name": maybe(rng.choice(["dp", "tp"])), "rank": rank,
                   "n_ranks": maybe(rng.choice([8, 8, 8, -1]))},  # -1: not NULL
        "metadata": {"hostname": host, "pid": pid},
        **perf,
        "rankwatch": {
            "schema": 1, "kind": kind, "func": func, "seq": seq, "peer": 0,
            "msg_size_bytes": maybe(rng.choice([1024, 2048])),
            "arrival_ns": maybe(base + rng.randrange(4)),
            "gpu_start_ns": maybe(base + 10 + rng.randrange(4)),
            "gpu_end_ns": maybe(base + 50 + rng.randrange(4)),
            "clock_error_ns": maybe(rng.randrange(100)),
            "complete": maybe(rng.random() < 0.9),
        },
    }  # fmt: skip


def _random_job(out: Path, seed: int, records: int = 3000) -> Path:
    """Files of random records: few distinct times (ties), about one value in six
    NULL, two processes with two ranks each, one file holding two processes, one
    rank beyond what the packed member keys hold."""
    rng = random.Random(seed)
    out.mkdir()
    procs = [(HOSTS[r // 2], 100 + r // 2, r) for r in range(8)]
    procs[7] = (procs[7][0], procs[7][1], 1 << 21)
    by_file: dict[str, list[str]] = {}
    for _ in range(records):
        host, pid, rank = rng.choice(procs)
        name = "mixed" if pid in (100, 101) else f"{host}-pid{pid}"
        by_file.setdefault(name, []).append(json.dumps(_record(rng, host, pid, rank)))
    for name, lines in by_file.items():
        (out / f"{name}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def _odd_clocks_and_ranks(run: Run, rng: random.Random) -> None:
    """host_clock with offsets, drift and bounds, and no row for one host; rank_map
    without a world rank for some ranks."""
    run.con.execute(f"CREATE OR REPLACE TABLE host_clock ({HOST_CLOCK_COLUMNS})")
    for i, host in enumerate(HOSTS[:3]):  # hé has no clock: its times and bounds are NULL
        run.con.execute(
            "INSERT INTO host_clock VALUES (?, ?, ?, ?, 1000000, ?, 0, 0, 1, 1, 'test')",
            [host, i == 0, rng.choice([-3.5, 0.5, 2.0]), rng.choice([0.0, 2.5, 1e3]),
             rng.choice([0.0, 5.0, 5.0, 12.5])],
        )  # fmt: skip
    run.con.execute(  # typed as map_ranks types it
        "CREATE OR REPLACE TABLE rank_map AS SELECT DISTINCT comm_key, CAST(rank AS BIGINT) "
        "AS rank, host, pid, CAST(CASE WHEN rank < 7 THEN rank END AS BIGINT) AS world_rank "
        "FROM ops"
    )


def _kept_rows(kept: captured.CollectiveColumns) -> list[tuple]:
    """The kept columns decoded row by row, as the ops table holds them."""
    text = kept.strings
    out = []
    for i in range(kept.rows):
        cid, cname, rank, n_ranks, host, pid, key = kept.members[int(kept.member[i])]
        bits = int(kept.valid[i])

        def value(name: str, bits: int = bits, i: int = i) -> int | None:
            return int(kept.values[name][i]) if bits & captured.VALID_BITS[name] else None

        out.append((
            text[host], pid, text[cid], text[key] if key >= 0 else None,
            text[cname] if cname >= 0 else None, rank, n_ranks, text[int(kept.func[i])],
            int(kept.seq[i]), *(value(name) for name in captured.TIMES),
            not bits & captured.INCOMPLETE_BIT,
        ))  # fmt: skip
    return sorted(out, key=repr)


@pytest.mark.parametrize("seed", range(3))
def test_kept_columns_are_the_ops_tables_collective_rows(seed: int, tmp_path: Path) -> None:
    store = ingest([_random_job(tmp_path / "job", seed)], progress=False)
    assert store.collectives_kept is not None
    want = store.con.execute(
        "SELECT host, pid, comm_id, comm_key, comm_name, rank, n_ranks, func, seq, msg_bytes, "
        "arrival_ns, gpu_start_ns, gpu_end_ns, clock_error_ns, coalesce(complete, true) "
        "FROM ops WHERE kind = 'coll'"
    ).fetchall()
    assert _kept_rows(store.collectives_kept) == sorted(want, key=repr)


@pytest.mark.parametrize("seed", range(5))
def test_random_records_with_nulls_and_ties_give_the_sql_tables(seed: int, tmp_path: Path) -> None:
    run, kept = _ingested(_random_job(tmp_path / "job", seed))
    assert kept.rows == run.sql("SELECT count(*) FROM ops WHERE kind = 'coll'").fetchall()[0][0]
    _odd_clocks_and_ranks(run, random.Random(seed))
    tables = _align_both(run, kept)
    assert len(tables["native"]["collectives"]) > 100
    _assert_same(tables)


@pytest.mark.parametrize("job", ["clocks", "plain"])  # 16 hosts; TP x PP x DP communicators
def test_passes_of_a_simulated_job_give_the_one_pass_sql_tables(
    job: str, sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small chunks: a file's later chunks find their members among those kept before
    monkeypatch.setattr(native.Reader.__init__, "__defaults__", chunk_rows_default(512))
    run, kept = _ingested(sim(job))
    monkeypatch.setattr(kernels, "ROWS_PER_PASS", 1 + kept.rows // 5)
    tables = _align_both(run, kept)
    assert len(tables["native"]["collectives"]) > 500
    _assert_same(tables)


def test_the_compiled_forms_casts_are_the_sql_forms_types(tmp_path: Path) -> None:
    """The spelled-out types the kernels' rows are cast to are what DuckDB says the
    SQL forms yield (fails when a query or the ops view changes a type)."""
    run = ingest([_random_job(tmp_path / "job", 3, records=200)], progress=False).run()
    align(run)

    def described(query: str) -> tuple[tuple[str, str], ...]:
        return tuple((n, t) for n, t, *_ in run.con.execute(f"DESCRIBE {query}").fetchall())

    joined = collectives.JOINED_CTES.format(part="FALSE") + " SELECT * FROM joined"
    assert described(joined) == collectives.JOINED_TYPES
    assert described(collectives.RANK_LATENESS_QUERY) == collectives.RANK_LATENESS_TYPES


@pytest.mark.parametrize("seed", range(2))
def test_a_whole_alignment_reuses_the_clocks_grouping_and_gives_the_sql_tables(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """align() as analyze runs it: the clock's passes keep each pass's grouping and
    the collectives' passes take it instead of grouping again; the tables are the SQL
    form's (fails when a kept grouping is taken for the wrong pass or rows)."""
    run = ingest([_random_job(tmp_path / "job", seed)], progress=False).run()
    kept = run.meta["collectives_kept"]
    monkeypatch.setattr(kernels, "ROWS_PER_PASS", 1 + kept.rows // 3)
    grouped = []
    group = kernels._group
    monkeypatch.setattr(kernels, "_group", lambda *a: grouped.append(1) or group(*a))
    align(run)
    passes = kernels.passes(kept.rows)
    assert passes > 1 and len(grouped) == passes  # the collectives' passes grouped nothing
    native_tables = {t: _rows(run, t) for t in TABLES}
    collectives.align_collectives(run)  # the kept columns released: the SQL form
    _assert_same({"native": native_tables, "sql": {t: _rows(run, t) for t in TABLES}})


def test_kept_columns_stand_aside_when_some_ops_came_through_another_reader(
    tmp_path: Path,
) -> None:
    job = _random_job(tmp_path / "job", 7)
    bad = next(job.glob("h2-*.log"))
    bad.write_text(bad.read_text() + "{not json\n" + bad.read_text(), encoding="utf-8")
    store = ingest([job], progress=False)
    kept = store.collectives_kept
    assert kept is not None and bad.as_posix() not in store.native_files
    run = store.run()
    total = run.sql("SELECT count(*) FROM ops WHERE kind = 'coll'").fetchall()[0][0]
    assert kept.rows < total  # the bad file's ops came through the careful reader
    assert kernels.usable_kept(run) is None
    align(run)  # the SQL form, over every op
    assert run.sql("SELECT sum(n_seen) FROM collectives").fetchall()[0][0] == total


def test_an_overflowing_difference_raises_the_sql_error(tmp_path: Path) -> None:
    job = _random_job(tmp_path / "job", 0, records=300)
    path = next(job.glob("h2-*.log"))
    record = _record(random.Random(1), "h2", 102, 4)
    record["rankwatch"].update(
        kind="coll", seq=3, gpu_start_ns=9223372036854775000, gpu_end_ns=-9223372036854775000
    )
    path.write_text(path.read_text() + json.dumps(record) + "\n", encoding="utf-8")
    store = ingest([job], progress=False)
    run = store.run()
    assert run.meta.get("collectives_kept") is not None
    with pytest.raises(duckdb.OutOfRangeException, match="[Oo]verflow"):
        align(run)


# ---------------------------------------------------------------- host clocks


def _clocks_both(run: Run, kept: captured.CollectiveColumns) -> list[tuple[HostClock, HostClock]]:
    """Each host's clock as the SQL form and as the compiled form estimate it."""
    run.meta.pop("collectives_kept", None)
    by_sql = estimate_clocks(run)
    run.meta["collectives_kept"] = kept
    by_kernels = estimate_clocks(run)
    assert "collectives_kept" in run.meta  # kept for the collectives
    assert [h.host for h in by_sql.hosts] == [h.host for h in by_kernels.hosts]
    assert by_sql.consistent == by_kernels.consistent
    return list(zip(by_sql.hosts, by_kernels.hosts, strict=True))


def _assert_same_clocks(pairs: list[tuple[HostClock, HostClock]]) -> None:
    """Equal but for the order of summation of doubles (means of GPU end times)."""
    for a, b in pairs:
        for name in ("offset_ns", "drift_ppm", "bound_ns", "lo_ns", "hi_ns"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), (a, b)
            assert x is None or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-3), (name, a, b)
        assert (a.reference, a.pairs, a.constraints, a.method) == (
            b.reference, b.pairs, b.constraints, b.method,
        )  # fmt: skip


@pytest.mark.parametrize("job", ["clocks", "plain", "slow_gpu"])
def test_clock_estimates_equal_the_sql_form(job: str, sim) -> None:
    run, kept = _ingested(sim(job))
    pairs = _clocks_both(run, kept)
    assert sum(a.constraints for a, _ in pairs) > 100
    _assert_same_clocks(pairs)


def test_clock_estimates_of_many_hosts_use_the_same_pairs(tmp_path: Path) -> None:
    """Above MAX_ALL_PAIRS_HOSTS hosts only a ring and a star of host pairs are used."""
    simulate(SimConfig(ranks=40, hosts=40, steps=30, seed=9, clock_offset_us=3000, drift_ppm=5),
             tmp_path / "job")  # fmt: skip
    run, kept = _ingested(tmp_path / "job")
    pairs = _clocks_both(run, kept)
    assert sum(a.pairs for a, _ in pairs) < 40 * 39  # not every pair
    _assert_same_clocks(pairs)


@pytest.mark.parametrize("seed", range(3))
def test_clock_estimates_of_random_records_equal_the_sql_form(seed: int, tmp_path: Path) -> None:
    run, kept = _ingested(_random_job(tmp_path / "job", seed, records=6000))
    _assert_same_clocks(_clocks_both(run, kept))


@pytest.mark.parametrize("job", ["clocks", "random"])
def test_clock_pairs_over_two_halves_of_the_observations_equal_the_sql_form(
    job: str, sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above 2 * HALF_OBSERVATIONS observations the pair kernels run on two halves
    at once; what they find is what one call over all finds, and the SQL form."""
    monkeypatch.setattr(kernels, "HALF_OBSERVATIONS", 1)
    halves: list[int] = []
    made = kernels.ClockPairs.__init__

    def counted(self: kernels.ClockPairs, *args: Any) -> None:
        made(self, *args)
        halves.append(len(self._halves))

    monkeypatch.setattr(kernels.ClockPairs, "__init__", counted)
    directory = sim("clocks") if job == "clocks" else _random_job(tmp_path / "job", 1, 6000)
    run, kept = _ingested(directory)
    halves.clear()  # the alignment's own; the SQL form makes none
    _assert_same_clocks(_clocks_both(run, kept))
    assert halves == [2]


def test_medians_are_duckdbs_percentile_cont() -> None:
    rng = np.random.default_rng(5)
    sizes = [0, 1, 2, 3, 4, 5, 64, 65, 1000, 1001]
    values = np.concatenate([rng.integers(-5, 5, n).astype(float) * 0.1 for n in sizes])
    values[::7] = rng.normal(size=len(values[::7])) * 1e12  # wide and tied values
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    want = duckdb.sql(
        "SELECT s, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY v) FROM "
        "(SELECT unnest(?::BIGINT[]) AS s, unnest(?::DOUBLE[]) AS v) GROUP BY s ORDER BY s",
        params=[np.repeat(np.arange(len(sizes)), sizes).tolist(), values.tolist()],
    ).fetchall()
    got = kernels.medians(offsets, values.copy())
    assert np.isnan(got[0])
    assert [(s, float(got[s])) for s, _ in want] == want  # bit for bit


# ------------------------------------------------------------ the C side


def _enum(header: str, first: str) -> list[str]:
    """Names of the enum in `header` that starts with `first`, in order."""
    body = re.search(r"enum \{\s*(" + first + r"\b[^}]*)\}", header)
    assert body is not None, first
    return [name.strip().split(" ")[0] for name in body.group(1).split(",") if name.strip()]


def test_column_orders_match_the_header() -> None:
    header = (NATIVE_DIR / "rwalign.h").read_text()

    def names(first: str, prefix: str) -> tuple[str, ...]:
        return tuple(n.removeprefix(prefix).lower() for n in _enum(header, first)[:-1])

    assert names("RWA_IN_MEMBER", "RWA_IN_") == tuple(
        c.removesuffix("_c") for c in kernels.IN_COLUMNS
    )
    assert names("RWA_N_RANKS", "RWA_") == kernels.OUT_I64
    assert names("RWA_MEDIAN_ARRIVAL", "RWA_") == tuple(
        n.removesuffix("_ns") for n in kernels.OUT_F64
    )
    assert names("RWA_L_COLLECTIVES", "RWA_L_") == kernels.LATE_I64
    assert names("RWA_L_ARRIVAL_VS_MEDIAN_SUM", "RWA_L_") == kernels.LATE_F64
    assert names("RWA_M_COMM_KEY", "RWA_M_") + ("",) == (*kernels.MEMBER_COLUMNS, "")
    scratch = re.search(r"RWA_OBS_SCRATCH = (\d+)", header)
    assert scratch is not None and int(scratch.group(1)) == kernels.OBS_SCRATCH


def test_the_kept_layout_matches_its_header() -> None:
    header = (NATIVE_DIR / "rwkept.h").read_text()
    bits = dict(re.findall(r"RW_V_(\w+) = (\d+)", header))
    assert {k.lower(): int(v) for k, v in bits.items()} == {
        **{
            name.removesuffix("_ns").removesuffix("_bytes"): bit
            for name, bit in captured.VALID_BITS.items()
        },
        "incomplete": captured.INCOMPLETE_BIT,
    }
    slots = [n.removeprefix("RW_C_").lower() for n in _enum(header, "RW_C_KIND")[:-1]]
    assert slots == [c.removesuffix("_ns").removesuffix("_bytes") for c in captured.CAPTURE_COLUMNS]


@pytest.mark.skipif(c_compiler() is None, reason="no C compiler")
def test_kernels_survive_random_and_extreme_inputs_under_sanitizers(tmp_path: Path) -> None:
    binary = tmp_path / "fuzz_rwalign"
    build_sanitized(binary, ["tests/fuzz_rwalign.c", "rwalign.c"], "-ffp-contract=off")
    for seed in (1, 2, 3):
        out = run_sanitized(binary, "3000", str(seed))
        assert int(re.search(r"(\d+) reached the clock pairs", out).group(1)) > 50, out
