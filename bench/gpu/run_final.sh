#!/usr/bin/env bash
# The GPU measurements repeated on the final code (2 GPUs):
#
#   OUT=/some/dir bash bench/gpu/run_final.sh [PART...]
#
# PARTs (default: all, in this order):
#   overhead  median training step time without and with rankwatch (`rankwatch run`),
#             DDP, 3 interleaved rounds of 40 steps (bench/gpu/train_lm.py)
#   graph     the DDP job with a CUDA-graph all_reduce replayed every step: how many
#             GPU starts the plugin flags as stale, and the longest all_reduce duration
#   live      `rankwatch run --monitor` on an injected GPU straggler and on a hang:
#             when the monitor reported each finding, against the step the fault began
#   sweep     the all_reduce latency sweep (bench/gpu/latency_sweep.sh), 3 rounds
# Needs the rankwatch wheel and its missing dependencies (click, duckdb) in .whl/.
#
# $OUT afterwards: final.log (everything), summary.txt, final.tar.gz (logs, step
# files, monitor output, sweep results; op records of the live runs).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/gpu/common.sh
source "$here/common.sh"
gpu_start final.log rankwatch-final
summary="$work/summary.txt"

torchrun_cmd() { echo "$PYTHON -m torch.distributed.run --standalone --nproc_per_node=2"; }

median_step_ms() {  # DIR: median step time over steps >= 5, both ranks
  "$PYTHON" - "$1" <<'EOF'
import glob, json, statistics, sys
ms = [(s["end_ns"] - s["start_ns"]) / 1e6 for f in glob.glob(sys.argv[1] + "/steps-rank*.jsonl")
      for s in map(json.loads, open(f)) if s["step"] >= 5]
print(f"{statistics.median(ms):.2f}" if ms else "nan")
EOF
}

part_overhead() {
  local d="$work/overhead"
  mkdir -p "$d"
  for r in 1 2 3; do
    for cfg in none rankwatch; do
      local run="$d/$cfg-$r"
      # shellcheck disable=SC2046
      if [[ $cfg == none ]]; then
        timeout -k 10 180 $(torchrun_cmd) "$here/train_lm.py" --out "$run" --steps 40 >"$run.log" 2>&1
      else
        timeout -k 10 180 "$PYTHON" -m rankwatch run --dump-dir "$run/dump" -- \
          $(torchrun_cmd) "$here/train_lm.py" --out "$run" --steps 40 >"$run.log" 2>&1
      fi
      echo "overhead round $r $cfg rc=$? median_step_ms=$(median_step_ms "$run")" | tee -a "$summary"
    done
  done
  rm -rf "$d"/*/dump
}

part_graph() {
  local run="$work/graph"
  # shellcheck disable=SC2046
  timeout -k 10 180 "$PYTHON" -m rankwatch run --dump-dir "$run/dump" -- \
    $(torchrun_cmd) "$here/train_lm.py" --out "$run/job" --steps 30 --graph-metric >"$run.log" 2>&1
  echo "graph rc=$?" | tee -a "$summary"
  "$PYTHON" - "$run/dump" <<'EOF' | tee -a "$summary"
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.log")):
    n = stale = untimed = 0
    longest = 0.0
    for line in open(f):
        r = json.loads(line)["rankwatch"]
        n += 1
        stale += bool(r["gpu_start_stale"])
        untimed += r["gpu_start_ns"] is None
        if r["func"] == "AllReduce" and r["gpu_start_ns"] and r["gpu_end_ns"]:
            longest = max(longest, (r["gpu_end_ns"] - r["gpu_start_ns"]) / 1e3)
    print(f"graph records={n} stale={stale} no_gpu_start={untimed} longest_allreduce_us={longest:.0f}")
EOF
  mkdir -p "$OUT/graph-dump" && cp "$run"/dump/* "$OUT/graph-dump/" 2>/dev/null
}

# live NAME TIMEOUT ARGS...: the job under `rankwatch run --monitor`; the monitor's
# output (findings with the time they were reported) goes to NAME.log
live() {
  local name=$1 limit=$2
  shift 2
  local run="$work/live-$name"
  mkdir -p "$run"
  local t0=$SECONDS
  # shellcheck disable=SC2046
  # every output line stamped with the wall clock when it appeared (ns)
  timeout -k 10 "$limit" "$PYTHON" -m rankwatch run --monitor --dump-dir "$run/dump" -- \
    $(torchrun_cmd) "$here/train_lm.py" --out "$run/job" "$@" 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s%N)" "$line"; done >"$run.log"
  local rc=${PIPESTATUS[0]}
  pkill -f "train_lm.py --out $run/job" 2>/dev/null && sleep 2
  echo "live $name rc=$rc wall_s=$((SECONDS - t0))" | tee -a "$summary"
  grep -i -E "ALERT|finding|straggler|hang" "$run.log" | head -n 20 | tee -a "$summary"
  "$PYTHON" "$here/alert_latency.py" "$run" | tee -a "$summary"
}

part_live() {
  live gpu 240 --steps 60 --fault gpu --fault-step 25
  live hang 90 --steps 60 --fault hang --fault-step 25
}

part_sweep() {
  mkdir -p "$work/sweep"
  OUT="$work" SWEEP_DIR="$work/sweep" BUILD_DIR="$work/build" ROUNDS="${SWEEP_ROUNDS:-3}" \
    CONFIGS="${SWEEP_CONFIGS:-none null-0x46 null-0x6 rankwatch rankwatch-sampled rankwatch-off}" \
    bash "$here/latency_sweep.sh" |
    tee "$work/sweep/table.txt"
  cp -f "$work/sweep/sweep.jsonl" "$OUT/sweep.jsonl" 2>/dev/null
  cat "$work/sweep/table.txt" >>"$summary"
}

main() {
  step "machine"
  nvidia-smi -L
  step "install the rankwatch wheel"
  install_wheels || { echo "wheel install failed"; return 1; }
  local parts=("$@")
  ((${#parts[@]})) || parts=(overhead graph live sweep)
  for p in "${parts[@]}"; do
    step "part $p"
    "part_$p"
  done
  step "summary"
  cp "$summary" "$OUT/summary.txt"
  cat "$summary"
  tar -czf "$OUT/final.tar.gz" -C "$work" --exclude='build' --exclude='site' \
    --exclude='sweep/dumps' . 2>&1 | tail -n 2
  ls -la "$OUT"
}

main "$@"
