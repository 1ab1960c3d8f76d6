#!/usr/bin/env python3
"""Check rankwatch's records of a torch_collectives.py run against what it issued.

    python3 bench/gpu/check_records.py --dump DUMP_DIR --expected EXPECTED_DIR

DUMP_DIR holds the plugin's output (`*.log` op records and `*.rwstate.jsonl` state
records, format in docs/record-format.md); EXPECTED_DIR holds the
`expected-rank<R>.json` files torch_collectives.py wrote. Ranks are matched to
record files by process id. Standard library only.

Checks (one row each, PASS / WARN / FAIL):
  counts       op records per (function, message bytes) per rank vs issued; the
               4-byte AllReduces are dist.barrier() (WARN, not FAIL, if they differ)
  comms        the new_group all_reduces are on their own communicator
  graph        CUDA graph replays: one record per replay, marked graph_captured
  sizes        msg_size_bytes = count x datatype size; Broadcast/AllGather as ncclInt8
  complete     every record complete; GPU-timed when RANKWATCH_GPU_TIMING was on
  order        api_start <= api_end, enqueue_start <= enqueue_end,
               arrival <= gpu_start <= gpu_end (within the record's clock error)
  cross-rank   for each (comm, func, seq) of AllReduce/AllGather/ReduceScatter on
               both ranks: GPU end times agree within --tol-us plus both clock errors
  clock        clock records with an offset, lower <= upper, median error bounded
  stats        no dropped ops, no write errors (stale handles reported)
Exit status 0 when nothing FAILs.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys

DTYPE_BYTES = {
    "ncclInt8": 1,
    "ncclUint8": 1,
    "ncclInt32": 4,
    "ncclUint32": 4,
    "ncclInt64": 8,
    "ncclUint64": 8,
    "ncclFloat16": 2,
    "ncclFloat32": 4,
    "ncclFloat64": 8,
    "ncclBfloat16": 2,
    "ncclFloat8e4m3": 1,
    "ncclFloat8e5m2": 1,
}
SYMMETRIC = ("AllReduce", "AllGather", "ReduceScatter")
FIELDS = ("check", "rank", "detail", "expected", "got", "result")


def read_jsonl(path):
    out, bad = [], 0
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                bad += 1
    return out, bad


class Report:
    def __init__(self):
        self.rows = []

    def add(self, check, rank, detail, expected, got, result):
        self.rows.append(
            (check, "-" if rank is None else str(rank), detail, str(expected), str(got), result)
        )

    def print(self):
        hdr = ("check", "rank", "detail", "expected", "got", "result")
        w = [max(len(r[i]) for r in self.rows + [hdr]) for i in range(6)]
        w[2] = min(w[2], 100)
        line = "  ".join(h.ljust(w[i]) for i, h in enumerate(hdr))
        print(line)
        print("-" * len(line))
        for r in self.rows:
            print("  ".join((r[i] if i != 2 else r[i][:100]).ljust(w[i]) for i in range(6)))
        c = collections.Counter(r[5] for r in self.rows)
        print()
        print(f"summary: {c['PASS']} PASS, {c['WARN']} WARN, {c['FAIL']} FAIL")
        return c["FAIL"]


def rw_fields(rec):
    rw = rec.get("rankwatch") or {}
    perf = rec.get("coll_perf") or rec.get("p2p_perf") or {}
    size = rw.get("msg_size_bytes")
    if size is None:
        size = perf.get("coll_msg_size_bytes", perf.get("p2p_msg_size_bytes"))
    func = rw.get("func") or perf.get("coll") or perf.get("p2p")
    return rw, func, size


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = max(1, min(len(xs), int(round(p / 100.0 * len(xs) + 0.4999))))
    return xs[k - 1]


def main():
    ap = argparse.ArgumentParser(description="check rankwatch records against issued ops")
    ap.add_argument("--dump", required=True, help="rankwatch dump directory")
    ap.add_argument("--expected", required=True, help="directory with expected-rank*.json")
    ap.add_argument(
        "--tol-us",
        type=float,
        default=50.0,
        help="cross-rank GPU end-time tolerance on top of clock errors (default 50)",
    )
    ap.add_argument(
        "--max-clock-error-us",
        type=float,
        default=100.0,
        help="largest acceptable median clock error (default 100)",
    )
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    args = ap.parse_args()
    rep = Report()

    # ---- inputs
    expected = {}
    for path in sorted(glob.glob(os.path.join(args.expected, "expected-rank*.json"))):
        with open(path) as f:
            e = json.load(f)
        expected[e["rank"]] = e
    if not expected:
        rep.add("inputs", None, "expected-rank*.json in " + args.expected, ">=1", 0, "FAIL")
        return finish(rep, args)

    ops_by_pid = collections.defaultdict(list)
    bad_lines = 0
    for path in glob.glob(os.path.join(args.dump, "*.log")):
        recs, bad = read_jsonl(path)
        bad_lines += bad
        for r in recs:
            pid = (r.get("metadata") or {}).get("pid")
            ops_by_pid[pid].append(r)
    state_by_pid = collections.defaultdict(list)
    for path in glob.glob(os.path.join(args.dump, "*.rwstate.jsonl")):
        recs, bad = read_jsonl(path)
        bad_lines += bad
        for r in recs:
            state_by_pid[r.get("pid")].append(r)
    rep.add(
        "inputs",
        None,
        "unparsable lines in dump files",
        0,
        bad_lines,
        "PASS" if bad_lines == 0 else "FAIL",
    )

    per_rank_ops = {}
    for rank, e in sorted(expected.items()):
        recs = ops_by_pid.get(e["pid"], [])
        per_rank_ops[rank] = recs
        rep.add(
            "inputs",
            rank,
            f"op records of pid {e['pid']}",
            ">0",
            len(recs),
            "PASS" if recs else "FAIL",
        )

    for rank, e in sorted(expected.items()):
        recs = per_rank_ops[rank]
        if not recs:
            continue
        check_counts(rep, rank, e, recs)
        check_comms(rep, rank, e, recs)
        check_graph(rep, rank, e, recs)
        check_sizes(rep, rank, recs)
        check_complete(rep, rank, e, recs)
        check_order(rep, rank, recs)
        check_state(rep, rank, e, state_by_pid.get(e["pid"], []), args)
    check_cross_rank(rep, per_rank_ops, args)
    return finish(rep, args)


def finish(rep, args):
    fails = rep.print()
    if args.json:
        with open(args.json, "w") as f:
            rows = [dict(zip(FIELDS, r, strict=True)) for r in rep.rows]
            json.dump(rows, f, indent=1)
    return 1 if fails else 0


def check_counts(rep, rank, e, recs):
    want = collections.Counter()
    for kinds in e["expected"].values():
        for funcs in kinds.values():
            for func, sizes in funcs.items():
                for b, c in sizes.items():
                    want[(func, int(b))] += c
    got = collections.Counter()
    for r in recs:
        _, func, size = rw_fields(r)
        got[(func, size)] += 1
    barrier_key = ("AllReduce", e.get("barrier_bytes", 4))
    for key in sorted(set(want) | set(got), key=lambda k: (str(k[0]), k[1] or 0)):
        func, size = key
        w, g = want.get(key, 0), got.get(key, 0)
        if key == barrier_key:
            res = "PASS" if w == g else "WARN"
            detail = f"{func} {size} B (dist.barrier)"
        else:
            res = "PASS" if w == g else "FAIL"
            detail = f"{func} {size} B"
        rep.add("counts", rank, detail, w, g, res)
    rep.add(
        "counts",
        rank,
        "all op records",
        sum(want.values()),
        len(recs),
        "PASS"
        if sum(want.values()) == len(recs)
        else (
            "WARN"
            if all(want[k] == got[k] for k in set(want) | set(got) if k != barrier_key)
            else "FAIL"
        ),
    )


def check_comms(rep, rank, e, recs):
    comms = collections.Counter((r.get("header") or {}).get("id") for r in recs)
    rep.add(
        "comms",
        rank,
        "communicators with records",
        "2" if e.get("subgroup_bytes") else "1",
        len(comms),
        "PASS",
    )
    sub_bytes = e.get("subgroup_bytes")
    if not sub_bytes:
        return
    bar = e.get("barrier_bytes", 4)
    sub_ids, bar_ids = set(), set()
    for r in recs:
        _, func, size = rw_fields(r)
        cid = (r.get("header") or {}).get("id")
        if func == "AllReduce" and size == sub_bytes:
            sub_ids.add(cid)
        if func == "AllReduce" and size == bar:
            bar_ids.add(cid)
    ok = len(sub_ids) == 1 and not (sub_ids & bar_ids)
    rep.add(
        "comms",
        rank,
        "new_group all_reduce on its own comm",
        "1 comm, not the default",
        f"{sorted(map(str, sub_ids))} vs default {sorted(map(str, bar_ids))}",
        "PASS" if ok else "FAIL",
    )


def check_graph(rep, rank, e, recs):
    g = e.get("graph")
    if not g:
        return
    sel = [r for r in recs if rw_fields(r)[1] == g["func"] and rw_fields(r)[2] == g["size_bytes"]]
    captured = sum(1 for r in sel if (r.get("rankwatch") or {}).get("graph_captured") is True)
    want_total = g["eager_warmup"] + g["replays"]
    rep.add(
        "graph",
        rank,
        "records of the graph's all_reduce (warmup + replays)",
        want_total,
        len(sel),
        "PASS" if len(sel) == want_total else "FAIL",
    )
    rep.add(
        "graph",
        rank,
        "of them graph_captured=true",
        g["replays"],
        captured,
        "PASS" if captured == g["replays"] else "FAIL",
    )
    null_api = sum(
        1
        for r in sel
        if (r.get("rankwatch") or {}).get("graph_captured") is True
        and (r.get("rankwatch") or {}).get("api_start_ns") is None
    )
    rep.add(
        "graph",
        rank,
        "replays with api_start_ns null",
        captured,
        null_api,
        "PASS" if null_api == captured else "WARN",
    )
    seqs = sorted(
        (r.get("rankwatch") or {}).get("seq")
        for r in sel
        if (r.get("rankwatch") or {}).get("seq") is not None
    )
    distinct = len(set(seqs)) == len(seqs)
    rep.add(
        "graph",
        rank,
        "replay seq numbers distinct (KernelCh on)",
        "distinct",
        seqs,
        "PASS" if distinct else "WARN",
    )


def check_sizes(rep, rank, recs):
    bad, unknown, not_int8 = [], 0, []
    for r in recs:
        rw, func, size = rw_fields(r)
        dt, count = rw.get("datatype"), rw.get("count")
        if dt not in DTYPE_BYTES or count is None:
            unknown += 1
            continue
        if size != count * DTYPE_BYTES[dt]:
            bad.append((func, dt, count, size))
        if func in ("Broadcast", "AllGather") and dt != "ncclInt8":
            not_int8.append((func, dt))
    rep.add(
        "sizes",
        rank,
        "msg_size_bytes == count x sizeof(datatype)",
        0,
        f"{len(bad)} bad" + (f" e.g. {bad[0]}" if bad else ""),
        "PASS" if not bad else "FAIL",
    )
    if unknown:
        rep.add("sizes", rank, "records with unknown datatype or null count", 0, unknown, "WARN")
    rep.add(
        "sizes",
        rank,
        "Broadcast/AllGather reported as ncclInt8 bytes",
        0,
        f"{len(not_int8)} other" + (f" e.g. {not_int8[0]}" if not_int8 else ""),
        "PASS" if not not_int8 else "WARN",
    )


def check_complete(rep, rank, e, recs):
    incomplete = sum(1 for r in recs if (r.get("rankwatch") or {}).get("complete") is not True)
    rep.add(
        "complete",
        rank,
        "records with complete=true",
        len(recs),
        len(recs) - incomplete,
        "PASS" if incomplete == 0 else "FAIL",
    )
    timing = (e.get("gpu_timing") or "on").lower()
    timed = sum(1 for r in recs if (r.get("rankwatch") or {}).get("gpu_timed") is True)
    srcs = collections.Counter(
        (r.get("coll_perf") or {}).get("coll_timing_source")
        or (r.get("p2p_perf") or {}).get("p2p_timing_source")
        for r in recs
    )
    if timing == "on":
        # NCCL reports no channel events for a P2P op with the rank itself (all_to_all's
        # self send/recv), and some channel starts that belong to earlier ops, which the
        # plugin flags as stale: neither can be GPU-timed.
        def untimeable(r):
            rw = r.get("rankwatch") or {}
            self_p2p = rw.get("kind") == "p2p" and rw.get("peer") == r["header"]["rank"]
            return self_p2p or rw.get("gpu_start_stale") is True
        expected = sum(1 for r in recs if not untimeable(r))
        stale = sum(1 for r in recs if (r.get("rankwatch") or {}).get("gpu_start_stale"))
        rep.add(
            "complete",
            rank,
            f"GPU-timed records (on; {stale} stale GPU starts flagged, self P2P untimed)",
            expected,
            timed,
            "PASS" if timed == expected else "FAIL",
        )
        rep.add(
            "complete",
            rank,
            "timing source kernel_gpu",
            expected,
            srcs.get("kernel_gpu", 0),
            "PASS" if srcs.get("kernel_gpu", 0) == expected else "FAIL",
        )
    elif timing == "off":
        rep.add(
            "complete",
            rank,
            "GPU-timed records (RANKWATCH_GPU_TIMING=off)",
            0,
            timed,
            "PASS" if timed == 0 else "FAIL",
        )
    else:
        rep.add(
            "complete",
            rank,
            f"GPU-timed records (RANKWATCH_GPU_TIMING={timing})",
            "some",
            timed,
            "PASS",
        )


def check_order(rep, rank, recs):
    viol = []
    checked = 0
    for r in recs:
        rw = r.get("rankwatch") or {}
        g = rw.get

        def le(a, b, slack=0):
            return a is None or b is None or a <= b + slack

        problems = []
        if not le(g("api_start_ns"), g("api_end_ns")):
            problems.append("api_start>api_end")
        if not le(g("enqueue_start_ns"), g("enqueue_end_ns")):
            problems.append("enqueue_start>enqueue_end")
        if rw.get("gpu_timed"):
            checked += 1
            err = (g("clock_error_ns") or 0) + 2000  # plus GPU timer granularity (~1 us)
            if g("gpu_start_ns") is None or g("gpu_end_ns") is None:
                problems.append("gpu times null")
            else:
                # A graph replay's arrival is NCCL's host callback, which the replayed
                # kernel does not wait for: no order to check there.
                if not g("graph_captured") and not le(g("arrival_ns"), g("gpu_start_ns"), err):
                    problems.append(
                        "arrival>gpu_start by %.1f us"
                        % ((g("arrival_ns") - g("gpu_start_ns")) / 1e3)
                    )
                if not le(g("gpu_start_ns"), g("gpu_end_ns")):
                    problems.append("gpu_start>gpu_end")
                if g("gpu_end_ns") - g("gpu_start_ns") != g("exec_time_ns"):
                    problems.append("exec_time != gpu_end-gpu_start")
        if problems:
            viol.append((rw.get("func"), rw.get("seq"), problems))
    rep.add(
        "order",
        rank,
        f"timestamp order ({checked} GPU-timed records)",
        0,
        f"{len(viol)} bad" + (f" e.g. {viol[0]}" if viol else ""),
        "PASS" if not viol else "FAIL",
    )


def check_cross_rank(rep, per_rank_ops, args):
    ranks = sorted(r for r, recs in per_rank_ops.items() if recs)
    if len(ranks) < 2:
        rep.add("cross-rank", None, "ranks with records", ">=2", len(ranks), "FAIL")
        return
    idx = {}
    for rank in ranks:
        for r in per_rank_ops[rank]:
            rw = r.get("rankwatch") or {}
            if rw.get("kind") != "coll" or not rw.get("gpu_timed"):
                continue
            key = ((r.get("header") or {}).get("id"), rw.get("func"), rw.get("seq"))
            idx.setdefault(key, {})[rank] = rw
    a, b = ranks[0], ranks[1]
    by_func = collections.defaultdict(list)
    outside = collections.defaultdict(list)
    durs = collections.defaultdict(list)
    for key, per in idx.items():
        if a not in per or b not in per:
            continue
        ra, rb = per[a], per[b]
        if None in (ra.get("gpu_end_ns"), rb.get("gpu_end_ns")):
            continue
        d = abs(ra["gpu_end_ns"] - rb["gpu_end_ns"])
        tol = args.tol_us * 1e3 + (ra.get("clock_error_ns") or 0) + (rb.get("clock_error_ns") or 0)
        func = key[1]
        by_func[func].append(d)
        if ra.get("exec_time_ns") is not None and rb.get("exec_time_ns") is not None:
            durs[func].append(abs(ra["exec_time_ns"] - rb["exec_time_ns"]))
        if d > tol:
            outside[func].append((key[2], round(d / 1e3, 1), round(tol / 1e3, 1)))
    for func in sorted(by_func):
        ds = by_func[func]
        p50, p99, dmax = pct(ds, 50) / 1e3, pct(ds, 99) / 1e3, max(ds) / 1e3
        dur50 = (pct(durs[func], 50) or 0) / 1e3
        detail = (
            f"{func} GPU end |rank{a}-rank{b}|: p50 {p50:.1f} p99 {p99:.1f} max {dmax:.1f} us;"
            f" |dur diff| p50 {dur50:.1f} us"
        )
        n_out = len(outside[func])
        res = "PASS" if n_out == 0 else "FAIL"
        if func not in SYMMETRIC:
            res = "PASS" if n_out == 0 else "WARN"  # rooted ops need not end together
        got = f"{len(ds) - n_out}/{len(ds)} within"
        if n_out:
            got += " e.g. seq {}: {} us > {} us".format(*outside[func][0])
        rep.add("cross-rank", None, detail, "all within tol", got, res)
    if not by_func:
        rep.add("cross-rank", None, "matched GPU-timed collectives across ranks", ">0", 0, "FAIL")


def check_state(rep, rank, e, states, args):
    kinds = collections.Counter(s.get("kind") for s in states)
    comms = [s for s in states if s.get("kind") == "comm"]
    rep.add(
        "state",
        rank,
        "comm records (abi {}, gpu_timing {})".format(
            sorted({s.get("abi_version") for s in comms}, key=str),
            sorted({s.get("gpu_timing") for s in comms}, key=str),
        ),
        "1 per comm",
        len(comms),
        "PASS" if comms else "FAIL",
    )
    clocks = [s for s in states if s.get("kind") == "clock"]
    by_comm = collections.defaultdict(list)
    for s in clocks:
        by_comm[(s.get("comm_id"), s.get("rank"))].append(s)
    if not clocks:
        rep.add("clock", rank, "clock records", ">0", 0, "FAIL")
    for (cid, _crank), cs in sorted(by_comm.items(), key=lambda kv: str(kv[0])):
        with_off = [s for s in cs if s.get("offset_ns") is not None]
        errs = [s["error_ns"] for s in with_off if s.get("error_ns") is not None]
        inverted = [
            s
            for s in with_off
            if s.get("lower_ns") is not None
            and s.get("upper_ns") is not None
            and s["lower_ns"] > s["upper_ns"]
        ]
        if not with_off:
            rep.add("clock", rank, f"comm {cid}: records with an offset", ">0", 0, "FAIL")
            continue
        med = statistics.median(errs) if errs else None
        offs = [s["offset_ns"] for s in with_off]
        errs_us = "/".join(f"{x / 1e3:.1f}" for x in (min(errs), med, max(errs))) if errs else "-"
        detail = (
            f"comm {cid}: {len(with_off)} records, offset {min(offs) / 1e3:.1f}.."
            f"{max(offs) / 1e3:.1f} us, error min/med/max {errs_us} us"
        )
        ok = med is not None and med <= args.max_clock_error_us * 1e3 and not inverted
        rep.add(
            "clock",
            rank,
            detail,
            f"med err <= {args.max_clock_error_us:g} us",
            "{}{}".format(
                "-" if med is None else f"{med / 1e3:.1f} us",
                f", {len(inverted)} lower>upper" if inverted else "",
            ),
            "PASS" if ok else "FAIL",
        )
    stats = [s for s in states if s.get("kind") == "stats"]
    if not stats:
        rep.add("stats", rank, "stats records", ">0", 0, "FAIL")
        return
    last = max(stats, key=lambda s: s.get("ts_ns") or 0)
    for key in ("dropped_pool_full", "write_errors"):
        v = last.get(key)
        rep.add(
            "stats",
            rank,
            "{} (reason {})".format(key, last.get("reason")),
            0,
            v,
            "PASS" if v == 0 else "FAIL",
        )
    rep.add(
        "stats",
        rank,
        "stale_handles / ops_started / records_written",
        "-",
        "{} / {} / {}".format(
            last.get("stale_handles"), last.get("ops_started"), last.get("records_written")
        ),
        "PASS",
    )
    rep.add("state", rank, "state record kinds", "-", dict(kinds), "PASS")


if __name__ == "__main__":
    sys.exit(main())
