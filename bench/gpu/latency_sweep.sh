#!/usr/bin/env bash
# All-reduce latency with and without profiler plugins, configurations interleaved.
#
#   OUT=DIR bash bench/gpu/latency_sweep.sh [extra allreduce_latency options]
#
# Configurations, each run as its own process (one process drives both GPUs):
#   none               NCCL_PROFILER_PLUGIN unset
#   null-0x46          null plugin, mask Coll|P2p|KernelCh (rankwatch's mask)
#   null-0x6           null plugin, mask Coll|P2p (no GPU timing)
#   rankwatch          RANKWATCH_GPU_TIMING=on
#   rankwatch-sampled  RANKWATCH_GPU_TIMING=sampled
#   rankwatch-off      RANKWATCH_GPU_TIMING=off
# Every round runs all of them, starting at a different one each round.
#
# Environment: OUT (required; results go to OUT/sweep unless SWEEP_DIR is set),
# ROUNDS (default 5), CONFIGS (default: all six, space-separated), BUILD_DIR (as for
# build.sh; paths.env is read from there and built if missing), RUN_TIMEOUT (seconds
# per process, default 120).
#
# Writes SWEEP_DIR/sweep.jsonl (one JSON line per size per run, label "<config>@r<round>"),
# SWEEP_DIR/logs/*.err, SWEEP_DIR/dumps/<config>-r<round>/ (rankwatch output), and
# prints a table: per size, the median over rounds of each configuration's median
# latency, rankwatch - null-0x46 (us/op) and sampled vs none (%). It also counts
# rankwatch's op records per communicator against the ops issued.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$(cd "$here/.." && pwd)"
: "${OUT:?set OUT to an output directory}"
sweep="${SWEEP_DIR:-$OUT/sweep}"
ROUNDS="${ROUNDS:-5}"
CONFIGS="${CONFIGS:-none null-0x46 null-0x6 rankwatch rankwatch-sampled rankwatch-off}"
RUN_TIMEOUT="${RUN_TIMEOUT:-120}"
build="${BUILD_DIR:-$bench/.build/gpu}"
extra=("$@")

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [[ ! -f "$build/paths.env" ]]; then
  BUILD_DIR="$build" bash "$here/build.sh" || exit 1
fi
# shellcheck disable=SC1091
source "$build/paths.env"

mkdir -p "$sweep/logs" "$sweep/dumps"
jsonl="$sweep/sweep.jsonl"
: >"$jsonl"
read -r -a cfgs <<<"$CONFIGS"
n=${#cfgs[@]}
failures=0

run_one() { # config round
  local cfg="$1" r="$2" dump="$sweep/dumps/$1-r$2"
  local -a env_args=(env -u NCCL_PROFILER_PLUGIN -u NULL_PLUGIN_MASK -u RANKWATCH_GPU_TIMING)
  case "$cfg" in
    none) ;;
    null-0x46) env_args+=(NCCL_PROFILER_PLUGIN="$NULL_SO" NULL_PLUGIN_MASK=0x46) ;;
    null-0x6) env_args+=(NCCL_PROFILER_PLUGIN="$NULL_SO" NULL_PLUGIN_MASK=0x6) ;;
    rankwatch) env_args+=(NCCL_PROFILER_PLUGIN="$RW_SO" RANKWATCH_GPU_TIMING=on) ;;
    rankwatch-sampled) env_args+=(NCCL_PROFILER_PLUGIN="$RW_SO" RANKWATCH_GPU_TIMING=sampled) ;;
    rankwatch-off) env_args+=(NCCL_PROFILER_PLUGIN="$RW_SO" RANKWATCH_GPU_TIMING=off) ;;
    *) echo "latency_sweep: unknown config $cfg" >&2; return 1 ;;
  esac
  if [[ "$cfg" == rankwatch* && -z "${RW_SO:-}" ]]; then
    echo "latency_sweep: no rankwatch plugin built; skipping $cfg" >&2
    return 1
  fi
  mkdir -p "$dump"
  env_args+=(RANKWATCH_DUMP_DIR="$dump")
  local t0=$SECONDS
  timeout -k 10 "$RUN_TIMEOUT" "${env_args[@]}" "$ALLREDUCE_BIN" --label "$cfg@r$r" \
    ${extra[@]+"${extra[@]}"} >>"$jsonl" 2>"$sweep/logs/$cfg-r$r.err"
  local rc=$?
  echo "latency_sweep: round $r $cfg rc=$rc $((SECONDS - t0))s" >&2
  if [[ $rc -ne 0 ]]; then
    tail -n 5 "$sweep/logs/$cfg-r$r.err" >&2
    return 1
  fi
}

for ((r = 1; r <= ROUNDS; r++)); do
  for ((i = 0; i < n; i++)); do
    cfg="${cfgs[$(((i + r - 1) % n))]}"
    run_one "$cfg" "$r" || failures=$((failures + 1))
  done
done

python3 - "$sweep" "$CONFIGS" <<'EOF'
import collections, glob, json, os, statistics, sys

sweep, configs = sys.argv[1], sys.argv[2].split()
rows = []
for line in open(os.path.join(sweep, "sweep.jsonl")):
    line = line.strip()
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass

lat = collections.defaultdict(list)   # (config, size) -> [median_us per round]
ops = {}                              # (config, round) -> ops_per_comm
for d in rows:
    cfg, _, rnd = d.get("label", "").partition("@r")
    if d.get("summary"):
        ops[(cfg, rnd)] = d.get("ops_per_comm")
    elif d.get("mode") == "timed":
        lat[(cfg, d["size_bytes"])].append(d["median_us"])

sizes = sorted({s for (_, s) in lat})
present = [c for c in configs if any((c, s) in lat for s in sizes)]

def med(xs):
    return statistics.median(xs) if xs else float("nan")

def fmt_size(b):
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    return "%d B" % b

print()
print("all_reduce latency, us/op: median over rounds of each run's median "
      "(rounds per config: %s)" % ", ".join(
          "%s=%d" % (c, max((len(lat[(c, s)]) for s in sizes), default=0)) for c in present))
cols = ["size"] + present + ["rw-null46 us", "sampled/none %", "rw/none %", "off-null6 us"]
widths = [8] + [max(9, len(c)) for c in present] + [12, 14, 9, 12]
print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
for s in sizes:
    m = {c: med(lat[(c, s)]) for c in present}
    cells = [fmt_size(s)] + ["%.2f" % m[c] for c in present]
    def diff(a, b):
        return "%.2f" % (m[a] - m[b]) if a in m and b in m else "-"
    def pct(a, b):
        return "%+.1f" % (100.0 * (m[a] / m[b] - 1)) if a in m and b in m and m[b] else "-"
    cells += [diff("rankwatch", "null-0x46"), pct("rankwatch-sampled", "none"),
              pct("rankwatch", "none"), diff("rankwatch-off", "null-0x6")]
    print("  ".join(str(c).rjust(w) for c, w in zip(cells, widths)))
print()
print("per-round medians (us) at each size:")
for s in sizes:
    print("  %-7s " % fmt_size(s) + "  ".join(
        "%s=[%s]" % (c, ",".join("%.1f" % x for x in lat[(c, s)])) for c in present))

# Record counts: every rankwatch run must hold one op record per all_reduce per
# communicator (warmup included).
print()
print("rankwatch op records per communicator vs all_reduce calls issued:")
bad = 0
checked = 0
for (cfg, rnd), n in sorted(ops.items()):
    if not cfg.startswith("rankwatch"):
        continue
    dump = os.path.join(sweep, "dumps", "%s-r%s" % (cfg, rnd))
    per_comm = collections.Counter()
    for path in glob.glob(os.path.join(dump, "*.log")):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                h = rec.get("header", {})
                per_comm[(h.get("id"), h.get("rank"))] += 1
    ok = len(per_comm) == 2 and all(v == n for v in per_comm.values())
    checked += 1
    bad += not ok
    print("  %-22s issued %s per comm; records %s  %s" % (
        "%s@r%s" % (cfg, rnd), n, sorted(per_comm.values()) or "none", "PASS" if ok else "FAIL"))
print("record counts: %d runs checked, %d FAIL" % (checked, bad))
EOF

echo "latency_sweep: $failures failed runs; raw results in $jsonl" >&2
exit $((failures > 0))
