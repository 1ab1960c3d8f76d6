"""P2P alignment from the rows the native reader kept as it parsed
(rankwatch.store.p2p_rows) gives the pairs a scan of ops gives."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
from analysis_support import first_op_lines, inspector_p2p, write_lines

from helpers import chunk_rows_default
from rankwatch.align import align, p2p
from rankwatch.store import EngineSettings, ingest, native
from rankwatch.store.engine import DEFAULT_MEMORY_LIMIT
from rankwatch.store.p2p_rows import KEPT_P2P


def _same_rows(run, a: str, b: str) -> None:
    assert run.con.sql(f"SELECT * FROM {a}").types == run.con.sql(f"SELECT * FROM {b}").types
    for x, y in ((a, b), (b, a)):
        only = f"SELECT count(*) FROM (SELECT * FROM {x} EXCEPT ALL SELECT * FROM {y})"
        assert run.con.execute(only).fetchall()[0][0] == 0, f"rows only in {x}"


@pytest.mark.parametrize("held_bytes", [None, 1])
def test_p2p_pairs_from_kept_rows_equal_pairs_from_ops(
    sim, tmp_path, monkeypatch, held_bytes
) -> None:
    # Given a simulated job with P2P ops (pipeline stages), Inspector P2P records of
    # two more ranks (appended by DuckDB's reader), one unmatched Send, and a file
    # the native reader leaves to DuckDB's after its first chunks
    job = tmp_path / "job"
    shutil.copytree(sim("plain"), job)
    for rank in (0, 1):
        write_lines(
            job / "inspector" / f"other-host-pid{4000 + rank}.log",
            [inspector_p2p(rank, sn, "Send" if rank == 0 else "Recv", 1 - rank)
             for sn in range(4)] + ([inspector_p2p(0, 9, "Send", 1)] if rank == 0 else []),
        )  # fmt: skip
    good = [x for x in first_op_lines(sim("plain"), 400) if '"kind":"p2p"' in x][:20]
    assert len(good) == 20
    write_lines(job / "late-damage-pid77.log", good[:15] + ['{"header": oops'] + good[15:])
    monkeypatch.setattr(native.Reader.__init__, "__defaults__", chunk_rows_default(7))
    settings = EngineSettings(DEFAULT_MEMORY_LIMIT, None, None, native=True)
    store = ingest([job], progress=False, settings=replace(settings, held_bytes=held_bytes))
    run = store.run()
    assert KEPT_P2P in run.meta and run.meta[KEPT_P2P].table.num_rows > 0

    # When aligned (P2P from the kept rows), then P2P aligned again from a scan of ops
    align(run)
    assert KEPT_P2P not in run.meta
    run.con.execute("CREATE TABLE pairs_kept AS SELECT * FROM p2p_pairs")
    unmatched = run.meta["p2p_unmatched"]
    p2p.align_p2p(run)

    # Then both give the same pairs and the same unmatched count
    _same_rows(run, "p2p_pairs", "pairs_kept")
    assert run.meta["p2p_unmatched"] == unmatched >= 1
    inspector = run.con.execute("SELECT count(*) FROM p2p_pairs WHERE comm_key LIKE '0x7f8c%'")
    assert inspector.fetchall()[0][0] == 4
    assert run.con.execute("SELECT count(*) FROM p2p_pairs").fetchall()[0][0] > 10
