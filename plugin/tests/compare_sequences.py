#!/usr/bin/env python3
"""Compare profiler call sequences: a real NCCL capture against an echo-plugin log.

Both files use the capture format of shared/reference/real-nccl-callbacks
(plain or gzipped): ``<host ns> <tid> init|start|stop|record|finalize ...``.

``event_shape(lines)`` reduces a log to one *shape* per operation. An operation
is a set of events linked through ``parent``/``parentGroup`` (so a CUDA-graph
capture and all its replays form one operation); ids are replaced by local
indices in order of appearance. A shape keeps, per thread role, the ordered
(callback, type, parent structure, salient fields) of the host-side events;
KernelCh events, whose order across channels and operations depends on proxy
timing, are kept as a multiset of per-handle sequences. Thread roles are
labelled by kind and first appearance: A = threads that call init/GroupApi
(application), P = threads that report KernelCh/ProxyCtrl/ProxyOp (proxy),
C = others (the CUDA host-callback thread of graph replays).

``compare(capture_file, echo_file, phase)`` cuts both logs into the phases of
their ``phases.txt`` files (``[rank R] phase NAME t_ns=T``) and compares the
shapes of that phase's operations; it returns a list of differences (empty
when the shapes match).

Run ``compare_sequences.py CAPTURE ECHO [--phase NAME]...`` to print
differences, or ``compare_sequences.py --self-test DRIVER ECHO_SO CAPTURE_DIR``
to run fake_nccl with the echo plugin and check it against the mask70
captures (every phase, both ranks) and replays of every capture.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field

DEFAULT_IGNORE = ("ProxyCtrl",)
PROXY_TYPES = {"KernelCh", "ProxyCtrl", "ProxyOp", "ProxyStep", "NetPlugin"}


@dataclass
class Event:
    index: int
    ts: int
    tid: str
    verb: str
    id: int = 0
    type: str = ""
    parent: str = "0"
    kv: dict = field(default_factory=dict)


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def parse(lines) -> list[Event]:
    """Lines of a capture or echo log -> events (malformed lines skipped)."""
    out = []
    for line in lines:
        words = line.split()
        if len(words) < 3 or not words[0].isdigit():
            continue
        kv = dict(w.split("=", 1) for w in words[3:] if "=" in w)
        ev = Event(len(out), int(words[0]), words[1], words[2], kv=kv)
        if not kv.get("id", "0").isdigit():
            continue  # e.g. "stop id=0 type=?" from a deliberately hostile call
        ev.id = int(kv.get("id", "0"))
        ev.type = kv.get("type", "")
        ev.parent = kv.get("parent", "0")
        out.append(ev)
    return out


def thread_labels(events: list[Event], ops: list[list[Event]] | None = None) -> dict[str, str]:
    """tid -> role label. Proxy threads are numbered by the first operation they
    report for (not by the time of their first line, which depends on how far
    each proxy lags), the others by first appearance."""
    kinds: dict[str, str] = {}
    for ev in events:
        k = kinds.get(ev.tid)
        if ev.verb == "start" and ev.type in PROXY_TYPES:
            kinds[ev.tid] = "P"
        elif k is None or (k == "C" and (ev.verb == "init" or ev.type == "GroupApi")):
            kinds[ev.tid] = "A" if ev.verb == "init" or ev.type == "GroupApi" else "C"
    first_op: dict[str, int] = {}
    for i, op in enumerate(ops or []):
        for ev in op:
            if kinds[ev.tid] == "P":
                first_op.setdefault(ev.tid, i)
    order: dict[str, tuple] = {}
    for ev in events:
        order.setdefault(ev.tid, (first_op.get(ev.tid, len(events)), ev.index))
    labels, counts = {}, Counter()
    for tid in sorted(order, key=order.get):
        kind = kinds[tid]
        labels[tid] = f"{kind}{counts[kind]}"
        counts[kind] += 1
    return labels


class _UnionFind:
    def __init__(self):
        self.up: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.up.setdefault(x, x)
        while self.up[x] != x:
            self.up[x] = self.up[self.up[x]]
            x = self.up[x]
        return x

    def join(self, a: int, b: int):
        self.up[self.find(a)] = self.find(b)


def _ref(value: str) -> int | None:
    return int(value) if value.isdigit() and value != "0" else None


def operations(events: list[Event], ignore=DEFAULT_IGNORE) -> list[list[Event]]:
    """Group events into operations (connected through parent/parentGroup)."""
    uf, started = _UnionFind(), set()
    for ev in events:
        if ev.verb == "start" and ev.type not in ignore:
            started.add(ev.id)
            uf.find(ev.id)
            for key in ("parent", "parentGroup"):
                ref = _ref(ev.kv.get(key, "0"))
                if ref in started:
                    uf.join(ev.id, ref)
    ops: dict[int, list[Event]] = {}
    for ev in events:
        if ev.verb in ("start", "stop", "record") and ev.id in started:
            ops.setdefault(uf.find(ev.id), []).append(ev)
    return sorted(ops.values(), key=lambda evs: evs[0].index)


def _extra(ev: Event) -> tuple:
    kv = ev.kv
    if ev.type == "GroupApi":
        return ("depth=" + kv.get("depth", "?"), "graph=" + kv.get("graph", "?"))
    if ev.type in ("Coll", "CollApi", "P2pApi"):
        return (kv.get("func"), kv.get("dt"))
    if ev.type == "P2p":
        return (kv.get("func"), kv.get("dt"), "self" if kv.get("peer") == kv.get("rank") else "peer")
    return ()


def op_shape(op: list[Event], labels: dict[str, str]) -> tuple:
    """One operation -> (host sequences per thread label, KernelCh multiset)."""
    local: dict[int, int] = {}
    kc_parent, kc_seq, kc_at, stopped_at = {}, {}, {}, {}
    host: dict[str, list] = {}
    for ev in op:
        if ev.type == "KernelCh":
            if ev.verb == "start":
                kc_parent[ev.id] = _ref(ev.parent)
                kc_seq[ev.id] = [labels[ev.tid], "start"]
                kc_at[ev.id] = ev.index
            elif ev.id in kc_seq:
                kc_seq[ev.id].append(
                    ev.verb
                    if ev.verb == "stop"
                    else f"record{ev.kv.get('state')}" + ("/NULL" if ev.kv.get("args") == "NULL" else "")
                )
            continue
        if ev.verb == "start":
            local[ev.id] = len(local)
            tok = (
                "start",
                ev.type,
                local.get(_ref(ev.parent)),
                local.get(_ref(ev.kv.get("parentGroup", "0"))),
            ) + _extra(ev)
        elif ev.verb == "stop":
            stopped_at[ev.id] = ev.index
            tok = ("stop", ev.type, local.get(ev.id))
        else:
            tok = (
                "record",
                ev.type,
                local.get(ev.id),
                ev.kv.get("state"),
                "NULL" if ev.kv.get("args") == "NULL" else "args",
            )
        host.setdefault(labels[ev.tid], []).append(tok)
    kernels = Counter()
    for kid, seq in kc_seq.items():
        parent = kc_parent[kid]
        early = kc_at[kid] < stopped_at.get(parent, float("inf"))  # before its Coll/P2p stop
        kernels[(local.get(parent), tuple(seq), "early" if early else "")] += 1
    return (tuple((k, tuple(v)) for k, v in sorted(host.items())), tuple(sorted(kernels.items(), key=repr)))


def event_shape(lines, ignore=DEFAULT_IGNORE) -> list[tuple]:
    """Capture or echo-log lines -> list of operation shapes, in order."""
    events = parse(lines)
    ops = operations(events, ignore)
    labels = thread_labels(events, ops)
    return [op_shape(op, labels) for op in ops]


# ------------------------------------------------------------------ phases

_PHASE_RE = re.compile(r"\[rank (\d+)\] phase (\S+?) t_ns=(\d+)")


def read_phases(path: str, rank: int) -> list[tuple[str, int]]:
    """(name, t_ns) marks of one rank. Parsed by pattern, not by line: in the
    mask4095 capture two ranks' marks share a line (concurrent writes)."""
    text = "\n".join(read_lines(path))
    marks = [(m[2], int(m[3])) for m in _PHASE_RE.finditer(text) if int(m[1]) == rank]
    return sorted(marks, key=lambda p: p[1])


def file_rank(events: list[Event]) -> int:
    for ev in events:
        if ev.verb == "init":
            return int(ev.kv.get("rank", "0"))
    return 0


def _default_phases(path: str) -> str:
    for cand in (path + ".phases", os.path.join(os.path.dirname(path) or ".", "phases.txt")):
        if os.path.exists(cand):
            return cand
    raise FileNotFoundError(f"no phases file for {path}")


def phase_shapes(
    path: str, phase: str | None, phases_file: str | None = None, ignore=DEFAULT_IGNORE
) -> list[tuple]:
    events = parse(read_lines(path))
    ops = operations(events, ignore)
    labels = thread_labels(events, ops)
    if phase is not None:
        marks = read_phases(phases_file or _default_phases(path), file_rank(events))
        names = [m[0] for m in marks]
        if phase not in names:
            raise KeyError(f"phase {phase!r} not in {names}")
        i = names.index(phase)
        lo, hi = marks[i][1], marks[i + 1][1] if i + 1 < len(marks) else float("inf")
        ops = [op for op in ops if lo <= op[0].ts < hi]
    return [op_shape(op, labels) for op in ops]


def _fmt(shape: tuple) -> str:
    host, kernels = shape
    out = []
    for label, toks in host:
        out.append(f"    {label}: " + " | ".join(" ".join(str(x) for x in t if x is not None) for t in toks))
    for (parent, seq, early), n in kernels:
        out.append(f"    KernelCh x{n} parent=#{parent}: {' '.join(seq)} {early}".rstrip())
    return "\n".join(out)


def compare(
    capture_file: str,
    echo_file: str,
    phase: str | None,
    mode: str = "seq",
    capture_phases: str | None = None,
    echo_phases: str | None = None,
    ignore=DEFAULT_IGNORE,
) -> list[str]:
    """Differences between the capture's and the echo log's operation shapes.

    mode "seq": same operations in the same order; mode "set": the same set of
    distinct shapes (repetition counts ignored)."""
    a = phase_shapes(capture_file, phase, capture_phases, ignore)
    b = phase_shapes(echo_file, phase, echo_phases, ignore)
    where = f"phase {phase}" if phase else "whole file"
    if mode == "set":
        sa, sb = set(a), set(b)
        diffs = [f"{where}: only in capture:\n{_fmt(s)}" for s in a if s in sa - sb]
        diffs += [f"{where}: only in echo log:\n{_fmt(s)}" for s in b if s in sb - sa]
        return list(dict.fromkeys(diffs))
    diffs = []
    if len(a) != len(b):
        diffs.append(f"{where}: {len(a)} operations in capture, {len(b)} in echo log")
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            diffs.append(f"{where}: operation {i} differs\n  capture:\n{_fmt(x)}\n  echo:\n{_fmt(y)}")
    return diffs


# ------------------------------------------------------------------ self test


def _run(cmd: list[str], env: dict) -> str:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    return res.stdout


def _gunzip(src: str, dst: str) -> str:
    with gzip.open(src, "rt") as f, open(dst, "w") as g:
        g.write(f.read())
    return dst


def _workload_vs_capture(driver: str, echo_so: str, capture_dir: str, sub: str, tmp: str) -> int:
    """fake_nccl's workload scenario, per rank, against one capture set, phase by
    phase (ProxyCtrl events, which depend on proxy timing, are left out)."""
    failures, mask = 0, "0xfff" if sub == "mask4095" else "0x46"
    folder = os.path.join(capture_dir, sub)
    for cap in sorted(f for f in os.listdir(folder) if f.endswith(".gz")):
        rank = int(cap.split("rank")[1].split(".")[0])
        log = os.path.join(tmp, f"workload-{sub}-r{rank}.log")
        env = dict(os.environ, ECHO_LOG=log, ECHO_MASK=mask)
        _run(
            [
                driver,
                echo_so,
                "--scenario",
                "workload",
                "--rank",
                str(rank),
                "--nranks",
                "2",
                "--phases",
                log + ".phases",
            ],
            env,
        )
        for name, _ in read_phases(os.path.join(folder, "phases.txt"), rank):
            diffs = compare(os.path.join(folder, cap), log, name)
            failures += bool(diffs)
            print(f"{'FAIL' if diffs else 'ok  '} workload {sub} rank {rank} phase {name}")
            for d in diffs:
                print(d)
    return failures


def _replay_vs_capture(driver: str, echo_so: str, capture_dir: str, sub: str, tmp: str) -> int:
    """Each capture replayed through the echo plugin must give the capture's shapes."""
    failures, mask = 0, "0xfff" if sub == "mask4095" else "0x46"
    folder = os.path.join(capture_dir, sub)
    for cap in sorted(f for f in os.listdir(folder) if f.endswith(".gz")):
        plain = _gunzip(os.path.join(folder, cap), os.path.join(tmp, f"{sub}-{cap[:-3]}"))
        log = os.path.join(tmp, f"replay-{sub}-{cap}.log")
        _run(
            [driver, echo_so, "--scenario", "replay", "--replay", plain],
            dict(os.environ, ECHO_LOG=log, ECHO_MASK=mask),
        )
        diffs = compare(plain, log, None, ignore=())
        failures += bool(diffs)
        print(f"{'FAIL' if diffs else 'ok  '} replay {sub}/{cap}")
        for d in diffs[:5]:
            print(d)
    return failures


def self_test(driver: str, echo_so: str, capture_dir: str) -> int:
    """fake_nccl + echo plugin against the captures: the workload scenario phase
    by phase (mask 0x46 and 0xfff), and replays of every capture."""
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for sub in ("mask70", "mask4095"):
            failures += _workload_vs_capture(driver, echo_so, capture_dir, sub, tmp)
        for sub in ("mask70", "mask4095"):
            failures += _replay_vs_capture(driver, echo_so, capture_dir, sub, tmp)
    print("self-test:", "FAILED" if failures else "all shapes match")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture", nargs="?")
    ap.add_argument("echo", nargs="?")
    ap.add_argument("--phase", action="append", help="phase name (repeatable; default: whole file)")
    ap.add_argument("--all-phases", action="store_true", help="every phase of the capture's phases file")
    ap.add_argument("--capture-phases")
    ap.add_argument("--echo-phases")
    ap.add_argument("--mode", choices=("seq", "set"), default="seq")
    ap.add_argument("--keep-proxyctrl", action="store_true", help="compare ProxyCtrl events too")
    ap.add_argument("--self-test", nargs=3, metavar=("DRIVER", "ECHO_SO", "CAPTURE_DIR"))
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(*args.self_test)
    if not (args.capture and args.echo):
        ap.error("need CAPTURE and ECHO (or --self-test)")
    ignore = () if args.keep_proxyctrl else DEFAULT_IGNORE
    phases = args.phase or [None]
    if args.all_phases:
        cap_events = parse(read_lines(args.capture))
        phases = [
            p
            for p, _ in read_phases(
                args.capture_phases or _default_phases(args.capture), file_rank(cap_events)
            )
        ]
    bad = 0
    for ph in phases:
        diffs = compare(args.capture, args.echo, ph, args.mode, args.capture_phases, args.echo_phases, ignore)
        print(f"{'FAIL' if diffs else 'ok  '} {ph or 'whole file'}")
        for d in diffs:
            print(d)
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
