"""The plugin never harms the job: bad directories, full disks, kills and hangs."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from driver import driver_binary, issued_colls, recorded_colls, run_driver
from helpers import load_jsonl
from rankwatch.collect.plugin import plugin_path


def _complete_lines(path: Path) -> tuple[list[dict], bytes]:
    """The file's complete JSON lines, and whatever follows the last newline."""
    data = path.read_bytes()
    body, _, tail = data.rpartition(b"\n")
    return [json.loads(line) for line in body.split(b"\n") if line], tail


def test_unwritable_dump_directory_leaves_the_job_running(tmp_path: Path) -> None:
    # Given a dump directory that cannot exist (a regular file is in the way;
    # root ignores permission bits, so chmod would prove nothing here)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    run = run_driver(blocker / "dump", "--scenario", "basic", "--verbose")
    # Then the job completes normally, records nothing, and NCCL's log says why once
    assert run.returncode == 0, run.stderr
    assert run.summary["comms"][0]["inits"] == 1
    assert run.stderr.count("cannot create or write dump directory") == 1


def test_file_size_limit_turns_output_off_and_keeps_what_was_written(tmp_path: Path) -> None:
    # Given a process that may write at most 64 KiB per file (a full disk, in effect)
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    run = run_driver(tmp_path, "--scenario", "basic", "--ops", "400", preexec_fn=limit)
    # Then the job is neither killed by SIGXFSZ nor slowed to a halt
    assert run.returncode == 0, run.stderr
    (log,) = tmp_path.glob("*.log")
    records, tail = _complete_lines(log)
    assert log.stat().st_size <= 64 * 1024
    assert 0 < len(records) < 400 * 5
    assert all(r["rankwatch"]["kind"] == "coll" for r in records)  # nothing garbled


def test_sigkill_loses_at_most_the_last_drain_period(tmp_path: Path) -> None:
    # Given a long-running job recording with the default 20 ms drain period
    proc = subprocess.Popen(
        [str(driver_binary()), "--scenario", "job", "--nranks", "1", "--steps", "100000",
         "--interval-sleep-us", "200", str(plugin_path())],
        env={**os.environ, "RANKWATCH_DUMP_DIR": str(tmp_path)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    # When it is killed without any chance to flush
    before_kill = time.time_ns()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    # Then every complete line is a valid record and the losses are recent ops only
    (log,) = tmp_path.glob("*.log")
    records, tail = _complete_lines(log)
    assert len(records) > 100
    last_written = max(r["metadata"]["dump_timestamp_us"] for r in records) * 1000
    assert before_kill - last_written < 200_000_000  # well within a few drain periods
    # and a line cut by the kill is only ever a record's beginning
    assert tail == b"" or tail.startswith(b'{"header":')


def test_progress_records_keep_coming_while_the_job_hangs(tmp_path: Path) -> None:
    # Given a rank that enqueues an op whose kernel never starts, then hangs
    proc = subprocess.Popen(
        [str(driver_binary()), "--scenario", "job", "--nranks", "1", "--steps", "50",
         "--hang-at-step", "3", str(plugin_path())],
        env={**os.environ, "RANKWATCH_DUMP_DIR": str(tmp_path), "RANKWATCH_INTERVAL_MS": "100"},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        summary = json.loads(proc.stdout.readline())
        assert summary["hung"] is True
        time.sleep(0.8)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    (state,) = tmp_path.glob("*.rwstate.jsonl")
    progress = [r for r in load_jsonl(state) if r["kind"] == "progress"]
    hung = [p for p in progress if p["in_flight_count"] > 0]
    # Then several interval records show the stuck op, enqueued and never started
    assert len(hung) >= 4
    stuck = hung[-1]["in_flight"][0]
    assert stuck["state"] == "enqueued" and stuck["func"] == "AllGather" and stuck["seq"] == 3
    assert stuck["age_ns"] >= 500_000_000
    assert hung[-1]["colls"]["AllGather"] == {"enqueued": 3, "started": 2, "completed": 2}


def test_inspector_variables_are_honoured(tmp_path: Path) -> None:
    # Given only NCCL Inspector's variables, as an Inspector user would set them
    dump = tmp_path / "inspector"
    env = {
        "RANKWATCH_DUMP_DIR": "",
        "NCCL_INSPECTOR_DUMP_DIR": str(dump),
        "NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES": str(1 << 20),
        "NCCL_INSPECTOR_ENABLE_P2P": "0",
    }
    run = run_driver(tmp_path / "unused", "--scenario", "workload", env=env)
    assert run.returncode == 0, run.stderr
    records = [r for f in dump.glob("*.log") for r in load_jsonl(f)]
    # Then records land there, small ops and P2P are left out, and the skips are counted
    assert records
    assert all("coll_perf" in r for r in records)
    assert all(r["coll_perf"]["coll_msg_size_bytes"] >= 1 << 20 for r in records)
    stats = [r for f in dump.glob("*.rwstate.jsonl") for r in load_jsonl(f)
             if r["kind"] == "stats"]
    assert stats[-1]["filtered_min_size"] > 0


def test_disabled_plugin_writes_nothing(tmp_path: Path) -> None:
    run = run_driver(tmp_path, "--scenario", "basic", env={"NCCL_INSPECTOR_ENABLE": "0"})
    assert run.returncode == 0, run.stderr
    assert not list(tmp_path.glob("*"))


def test_sampled_gpu_timing_records_every_op_and_times_some(tmp_path: Path) -> None:
    # Given GPU timing in 20 ms windows every 100 ms, ops every 0.5 ms for ~1.6 s
    env = {"RANKWATCH_GPU_TIMING": "sampled", "RANKWATCH_SAMPLE_PERIOD_MS": "100",
           "RANKWATCH_SAMPLE_WINDOW_MS": "20"}
    run = run_driver(tmp_path, "--scenario", "job", "--nranks", "1", "--steps", "800",
                     "--interval-sleep-us", "500", env=env)
    assert run.returncode == 0, run.stderr
    records = run.op_records()
    period, window = 100_000_000, 20_000_000
    # Then every op has a record, and about a fifth of them carry GPU times. An op
    # enqueued as a window opens or closes can run with the channel events NCCL read
    # from the mask before the plugin changed it: its record comes marked incomplete
    # (no channels), so count every record, and only at a window's edge may one be so.
    every = [dict(r, rankwatch=dict(r["rankwatch"], complete=True)) for r in records]
    assert recorded_colls(every) == issued_colls(run.summary)
    for r in records:
        if not r["rankwatch"]["complete"]:
            t = r["rankwatch"]["enqueue_start_ns"] % period
            assert min(t, abs(t - window), period - t) < 2e6, r["rankwatch"]
    timed = [r for r in records if r["rankwatch"]["gpu_timed"]]
    assert 0.05 < len(timed) / len(records) < 0.5
    # and the GPU-timed ones fall inside the windows, aligned to wall-clock time
    in_window = [r for r in timed if r["rankwatch"]["enqueue_start_ns"] % period < window + 2e6]
    assert len(in_window) >= 0.9 * len(timed)
    stats = run.state_records("stats")[-1]
    assert stats["slots_in_use"] == 0


FORK_SCRIPT = r"""
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
table = (ctypes.c_void_p * 6).in_dll(lib, "ncclProfiler_v5")
init = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,
                        ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_int,
                        ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(table[1])
ctx, mask = ctypes.c_void_p(), ctypes.c_int(0)
assert init(ctypes.byref(ctx), 0x1234, ctypes.byref(mask), b"world", 1, 2, 0, None) == 0
assert ctx.value and mask.value
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit: the plugin's destructor runs in the child
start = time.monotonic()
_, status = os.waitpid(pid, 0)
print(f"{time.monotonic() - start:.3f} {status}")
"""


def test_a_forked_child_exits_at_once(tmp_path: Path) -> None:
    # Given a process whose plugin runs its writer thread, forked (as data loaders do)
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(plugin_path())],
        env={**os.environ, "RANKWATCH_DUMP_DIR": str(tmp_path)},
        capture_output=True, text=True, timeout=60, check=True,
    )
    seconds, status = proc.stdout.split()
    # Then the child, which has no writer thread, does not wait for one at exit
    assert status == "0"
    assert float(seconds) < 1.0
