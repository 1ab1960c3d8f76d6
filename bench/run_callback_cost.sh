#!/usr/bin/env bash
# CPU cost of rankwatch's profiler callbacks, against the null plugin (the same
# event sequence answered by a plugin that does nothing).
#
#   bash bench/run_callback_cost.sh [RANKWATCH_SO] [-- extra callback_cost options]
#
# RANKWATCH_SO: the rankwatch plugin to measure. Default: `rankwatch plugin-path`
# (or `python3 -m rankwatch plugin-path`), else a fresh build of plugin/.
#
# Environment:
#   ROUNDS=5          interleaved rounds (null and rankwatch alternate which goes first)
#   THREADS="1 4"     application-thread counts to run (one communicator per thread)
#   MODE=lockstep     callback_cost --mode (lockstep or paced)
#   OUT_DIR=DIR       where the JSON lines, logs and dump directories go (default: a
#                     new temporary directory)
#   BUILD_DIR=DIR     where the binaries are built (default: bench/.build)
#   KEEP_DUMPS=1      keep the plugin's op records (*.log, ~1 KB per simulated op)
#
# Prints a table of medians over rounds and the difference rankwatch - null.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

rw_so=""
if [[ $# -gt 0 && "$1" != "--" ]]; then rw_so="$1"; shift; fi
if [[ $# -gt 0 && "$1" == "--" ]]; then shift; fi
extra=("$@")

ROUNDS="${ROUNDS:-5}"
THREADS="${THREADS:-1 4}"
MODE="${MODE:-lockstep}"
build_dir="${BUILD_DIR:-$here/.build}"
mkdir -p "$build_dir"
build_dir="$(cd "$build_dir" && pwd)"
out_dir="${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rankwatch-cbcost.XXXXXX")}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"

echo "== building null plugin and callback_cost in $build_dir" >&2
gcc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -I"$root/plugin/abi" \
  "$here/null_plugin.c" -o "$build_dir/null_plugin.so"
gcc -std=c11 -O2 -Wall -Wextra -I"$root/plugin/abi" "$here/callback_cost.c" \
  -o "$build_dir/callback_cost" -pthread -ldl

if [[ -z "$rw_so" ]]; then
  if command -v rankwatch >/dev/null 2>&1; then
    rw_so="$(rankwatch plugin-path 2>/dev/null || true)"
  fi
  if [[ -z "$rw_so" || ! -f "$rw_so" ]]; then
    rw_so="$(python3 -m rankwatch plugin-path 2>/dev/null || true)"
  fi
  if [[ -z "$rw_so" || ! -f "$rw_so" ]]; then
    echo "== no installed rankwatch plugin found; building plugin/" >&2
    rw_so="$(bash "$here/build_rankwatch.sh" "$build_dir/rankwatch" | tail -n 1)"
  fi
fi
[[ -f "$rw_so" ]] || { echo "run_callback_cost: no plugin at '$rw_so'" >&2; exit 1; }
echo "== rankwatch plugin: $rw_so" >&2
echo "== output: $out_dir  (rounds=$ROUNDS threads='$THREADS' mode=$MODE)" >&2

jsonl="$out_dir/callback_cost.jsonl"
: >"$jsonl"
for ((r = 1; r <= ROUNDS; r++)); do
  for t in $THREADS; do
    if ((r % 2)); then order=(null rankwatch); else order=(rankwatch null); fi
    for cfg in "${order[@]}"; do
      if [[ "$cfg" == null ]]; then so="$build_dir/null_plugin.so"; else so="$rw_so"; fi
      dump="$out_dir/dump-r$r-t$t-$cfg"
      mkdir -p "$dump"
      echo "-- round $r threads $t $cfg" >>"$out_dir/stderr.log"
      if ! "$build_dir/callback_cost" "$so" --label "$cfg" --threads "$t" --mode "$MODE" \
        --dump-dir "$dump" ${extra[@]+"${extra[@]}"} >>"$jsonl" 2>>"$out_dir/stderr.log"; then
        echo "run_callback_cost: callback_cost failed (round $r, $t threads, $cfg); see $out_dir/stderr.log" >&2
        tail -n 20 "$out_dir/stderr.log" >&2
        exit 1
      fi
      # The op records of these runs are large (about 1 KB per op) and not needed:
      # callback_cost already read the plugin's stats.
      [[ "${KEEP_DUMPS:-0}" == 1 ]] || rm -f "$dump"/*.log
    done
  done
done

python3 - "$jsonl" <<'EOF'
import glob, json, os, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]

# The plugin writes its final stats record when the process exits, after
# callback_cost printed its line: take it from the dump directory.
for d in rows:
    final = None
    for path in glob.glob(os.path.join(d.get("dump_dir") or "", "*.rwstate.jsonl")):
        for line in open(path, errors="replace"):
            if '"stats"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "stats" and (final is None or rec.get("reason") == "exit"):
                final = rec
    if final is not None:
        d["plugin_stats"] = final

by = {}
for d in rows:
    by.setdefault((d["threads"], d["label"]), []).append(d)

def med(xs):
    xs = [x for x in xs if x is not None and x >= 0]
    return statistics.median(xs) if xs else float("nan")

metrics = [
    # name, getter, start/stop pairs it contains (for the per-pair column)
    ("app: one AllReduce's callbacks", lambda d: d["op_seq"]["median_ns"], 4),
    ("app: one AllReduce, p99 batch", lambda d: d["op_seq"]["p99_ns"], 4),
    ("app: one AllReduce, p99 single op", lambda d: d["op_seq_single"]["p99_ns"], 4),
    ("app: Coll start/stop alone", lambda d: d["coll_pair"]["median_ns"], 1),
    ("proxy: KernelCh start/rec22/stop", lambda d: d["proxy_kernelch"]["median_ns"], 1),
]
print()
print("callback cost, ns per op: median over %d rounds (mode %s)"
      % (max(len(v) for v in by.values()), rows[0]["mode"] if rows else "?"))
hdr = "%-7s %-36s %9s %10s %9s %9s  %s" % ("threads", "measure", "null", "rankwatch",
                                           "diff", "per pair", "goal <100 ns/pair")
print(hdr)
print("-" * len(hdr))
worst = None
for t in sorted({k[0] for k in by}):
    n = by.get((t, "null"), [])
    w = by.get((t, "rankwatch"), [])
    for name, get, pairs in metrics:
        a = med([get(d) for d in n])
        b = med([get(d) for d in w])
        diff = b - a
        per = diff / pairs
        tail = "p99" in name
        ok = "" if tail else ("ok" if per < 100 else "OVER")
        if not tail and per == per:
            worst = per if worst is None else max(worst, per)
        print("%-7d %-36s %9.1f %10.1f %9.1f %9.1f  %s" % (t, name, a, b, diff, per, ok))
    for d in w[:1]:
        print("%-7s %-36s %9s %10.2f" % ("", "app calls per op (rankwatch)", "",
                                          d["op_seq_calls_per_op"]))
    st = [d.get("plugin_stats") for d in w if d.get("plugin_stats")]
    if st:
        drops = max(s.get("dropped_pool_full") or 0 for s in st)
        stale = max(s.get("stale_handles") or 0 for s in st)
        rec = [s.get("records_written") for s in st]
        print("%-7s plugin stats (rankwatch runs): records_written %s, max dropped_pool_full %d, "
              "max stale_handles %d" % ("", rec, drops, stale))
    else:
        print("%-7s plugin stats: none found in the dump directories" % "")
print()
if worst is not None:
    print("worst median difference per start/stop pair: %.1f ns (%s)"
          % (worst, "goal met" if worst < 100 else "goal NOT met"))
EOF
echo "raw JSON lines: $jsonl" >&2
