"""Ingest under a memory bound: DuckDB's limit and spill directory come from the
RANKWATCH_* settings, and a tight limit changes where data lives, not the result."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.align import align
from rankwatch.errors import ConfigError
from rankwatch.store import EngineSettings, engine, ingest
from rankwatch.store.engine import DEFAULT_MEMORY_LIMIT

FINGERPRINT = (
    "SELECT count(*), sum(hash(comm_key, func, seq, last_rank, last_world_rank, "
    "first_arrival, last_gpu_start, transfer_ns, lag_bound_ns)) FROM collectives"
)


def _analysed(directory: Path, settings: EngineSettings):
    run = ingest([directory], progress=False, settings=settings).run()
    align(run)
    return run


def test_settings_come_from_the_environment() -> None:
    assert EngineSettings.from_env({}) == EngineSettings(DEFAULT_MEMORY_LIMIT, None, None)
    got = EngineSettings.from_env(
        {"RANKWATCH_MEMORY_LIMIT": "none", "RANKWATCH_THREADS": "3", "RANKWATCH_SPILL_DIR": "/x"}
    )
    assert got == EngineSettings(None, "/x", 3)


@pytest.mark.parametrize("env", [{"RANKWATCH_THREADS": "0"}, {"RANKWATCH_THREADS": "two"}])
def test_bad_thread_counts_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="RANKWATCH_THREADS"):
        EngineSettings.from_env(env)


def test_a_bad_memory_limit_is_a_config_error(sim, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKWATCH_MEMORY_LIMIT", "lots")
    with pytest.raises(ConfigError, match="memory_limit"):
        ingest([sim("desync")], progress=False)


def test_the_connection_is_bounded_and_spills_privately(sim, tmp_path: Path) -> None:
    settings = EngineSettings(memory_limit="256MB", spill_parent=str(tmp_path), threads=1)
    run = ingest([sim("desync")], progress=False, settings=settings).run()
    limit, spill, threads = run.con.execute(
        "SELECT current_setting('memory_limit'), current_setting('temp_directory'), "
        "current_setting('threads')"
    ).fetchall()[0]
    assert limit.endswith("MiB") and float(limit.split()[0]) <= 256
    assert Path(spill).parent == tmp_path and Path(spill).name.startswith("rankwatch-spill-")
    assert int(threads) == 1


def test_a_tight_memory_limit_gives_the_same_analysis(sim, tmp_path: Path) -> None:
    # Given one job analysed with DuckDB's own default and with a tight bound
    directory = sim("plain")
    roomy = _analysed(directory, EngineSettings(memory_limit=None))
    tight = _analysed(directory, EngineSettings("128MB", str(tmp_path), threads=2))
    # Then every op and every matched collective is the same
    ops = "SELECT count(*), sum(hash(host, pid, comm_key, func, seq, gpu_end_ns)) FROM ops"
    assert tight.con.execute(ops).fetchall() == roomy.con.execute(ops).fetchall()
    assert tight.con.execute(FINGERPRINT).fetchall() == roomy.con.execute(FINGERPRINT).fetchall()


def test_compressing_the_store_changes_nothing_but_its_size(
    sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given one job analysed as is, and once with its tables compressed at every step
    # (every op row appended to the table: none held as Arrow, see store.held)
    directory = sim("plain")
    plain = _analysed(directory, EngineSettings(held_bytes=0))
    monkeypatch.setattr(engine, "COMPACT_FRACTION", 0.0)
    packed = _analysed(directory, EngineSettings(held_bytes=0))

    # Then the compressed store's ops are compressed, and the analysis is the same
    def methods(run) -> set[str]:
        rows = run.con.execute("SELECT DISTINCT compression FROM pragma_storage_info('ops')")
        return {r[0] for r in rows.fetchall()}

    assert methods(plain) == {"Uncompressed"}
    assert methods(packed) - {"Uncompressed"}
    ops = "SELECT count(*), sum(hash(host, pid, comm_key, func, seq, gpu_end_ns)) FROM ops"
    assert packed.con.execute(ops).fetchall() == plain.con.execute(ops).fetchall()
    assert packed.con.execute(FINGERPRINT).fetchall() == plain.con.execute(FINGERPRINT).fetchall()


def test_state_files_read_as_objects_give_what_the_typed_reader_gives(tmp_path: Path) -> None:
    """load.read_objects_sql (read_ndjson_objects + json_transform, fast on many small
    files) gives the rows and values read_json gives with the state columns: good
    records, wrong field types, malformed and non-object lines, overflow, blank lines,
    nested wrong types, escapes, several files (one gzipped)."""
    import gzip
    import json

    import duckdb

    from rankwatch.store.load import read_json_sql, read_objects_sql
    from rankwatch.store.tables import state_json_columns

    good = {
        "schema": 1, "kind": "progress", "ts_ns": 5, "hostname": "h\u00e9\\\"x", "pid": 7,
        "comm_id": "0xab", "rank": 1, "n_ranks": 2, "reason": "interval",
        "colls": {"AllReduce": {"enqueued": 3, "started": 2, "completed": 1}},
        "p2p": {"send_enqueued": 1, "send_completed": 0, "recv_enqueued": 0, "recv_completed": 0},
        "in_flight": [{"kind": "coll", "func": "AllReduce", "seq": 3, "peer": -1,
                       "state": "gpu_started", "arrival_ns": 4, "age_ns": 1,
                       "channels_started": 2, "channels_stopped": 1}],
    }  # fmt: skip
    lines = [
        json.dumps(good),
        json.dumps({**good, "rank": "three", "ts_ns": 2**64}),
        json.dumps({**good, "colls": 5, "p2p": {"send_enqueued": "x"}}),
        json.dumps({**good, "in_flight": [{"seq": "bad", "peer": 2**40}, 7]}),
        '{"kind": oops',
        "",
        "[1, 2]",
        json.dumps({"kind": "stats", "ts_ns": 9, "extra": {"nested": [1, {"a": None}]}}),
        "null",
        # content after the object: two records glued by a writer killed mid-line
        '{"kind":"progress","ts_ns":1}{"kind":"clock"}',
        '{"kind":"progress","ts_ns":2}}',
    ]
    (tmp_path / "a.rwstate.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "b.rwstate.jsonl").write_text("\n".join(reversed(lines)), encoding="utf-8")
    with gzip.open(tmp_path / "c.rwstate.jsonl.gz", "wt", encoding="utf-8") as stream:
        stream.write("\n".join(lines[:4]) + "\n")
    paths = sorted(str(p) for p in tmp_path.iterdir())
    con = duckdb.connect()
    columns = state_json_columns()
    typed = con.execute(f"SELECT * FROM {read_json_sql(paths, columns, True)} ORDER BY ALL")
    want, want_types = typed.fetchall(), [d[:2] for d in typed.description]
    objects = con.execute(f"SELECT * FROM {read_objects_sql(paths, columns)} ORDER BY ALL")
    got, got_types = objects.fetchall(), [d[:2] for d in objects.description]
    assert got_types == want_types
    assert len(want) == 2 * 10 + 4
    assert got == want
