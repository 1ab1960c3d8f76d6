#!/usr/bin/env bash
# The one entry point for the GPU machine (2 GPUs, NCCL from the Python environment):
#
#   OUT=/some/dir bash bench/gpu/run_device.sh
#
# 1. prints the machine: nvidia-smi -L, torch / NCCL / CUDA versions
# 2. builds the kit (bench/gpu/build.sh): allreduce_latency, null plugin,
#    callback_cost, and the rankwatch plugin from plugin/
# 3. callback_cost: rankwatch vs null plugin, CPU only (bench/run_callback_cost.sh)
# 4. torch_collectives.py under torchrun (2 ranks) with the rankwatch plugin loaded,
#    then check_records.py on its records (PASS/FAIL table)
# 5. the all_reduce latency sweep (bench/gpu/latency_sweep.sh)
# 6. saves results under $OUT and prints a summary.
#
# Files left in $OUT (at most 8, each well under 16 MB):
#   run_device.log          everything this script printed
#   summary.txt             the final summary
#   check_records.txt       the record checker's table
#   sweep.jsonl             raw latency results, one JSON line per size per run
#   callback_cost.jsonl     raw callback_cost results
#   rankwatch-bench.tar.gz  logs, expected counts, the torch run's dump directory,
#                           sweep state records (sweep op records left out: too big)
#   sweep-dump-sample.tar.gz  op records of one rankwatch sweep run (round 1)
#
# Environment: SWEEP_ROUNDS (default 5, cut to 3 when the earlier steps ran long),
# CB_ROUNDS (callback_cost rounds, default 3), TORCH_TIMEOUT (default 300 s),
# KEEP_WORK=1 to keep the scratch directory.
# Whole script: about 3-6 minutes.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$(cd "$here/.." && pwd)"
# shellcheck source=bench/gpu/common.sh
source "$here/common.sh"
gpu_start "" rankwatch-bench

main() {
  local t_build t_cb t_torch t_check t_sweep
  local build_rc=1 cb_rc=1 torch_rc=1 check_rc=1 sweep_rc=1

  step "machine"
  nvidia-smi -L 2>&1 || echo "nvidia-smi not available"
  nvidia-smi topo -m 2>&1 | head -n 6 || true
  "$PYTHON" - <<'EOF' 2>&1
import torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| NCCL", ".".join(map(str, torch.cuda.nccl.version())),
      "| GPUs", torch.cuda.device_count())
EOF
  gcc --version | head -n 1
  echo "cpus $(nproc)  kernel $(uname -r)"
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"

  step "build"
  t_build=$SECONDS
  BUILD_DIR="$work/build" bash "$here/build.sh"
  build_rc=$?
  t_build=$((SECONDS - t_build))
  if [[ $build_rc -ne 0 || ! -f "$work/build/paths.env" ]]; then
    echo "build failed (rc=$build_rc); trying again without the rankwatch plugin"
    SKIP_RANKWATCH=1 BUILD_DIR="$work/build" bash "$here/build.sh" || return 1
  fi
  # shellcheck disable=SC1091
  source "$work/build/paths.env"
  echo "rankwatch plugin: ${RW_SO:-NOT BUILT}"
  if [[ -n "${RW_SO:-}" ]]; then nm -D --defined-only "$RW_SO" | grep ncclProfiler_ || true; fi

  step "callback_cost (CPU): rankwatch vs null plugin"
  t_cb=$SECONDS
  mkdir -p "$work/cbcost"
  if [[ -n "${RW_SO:-}" ]]; then
    ROUNDS="${CB_ROUNDS:-3}" OUT_DIR="$work/cbcost" BUILD_DIR="$work/build/cb" \
      timeout -k 5 180 bash "$bench/run_callback_cost.sh" "$RW_SO" | tee "$work/cbcost/table.txt"
    cb_rc=${PIPESTATUS[0]}
    cp -f "$work/cbcost/callback_cost.jsonl" "$OUT/callback_cost.jsonl" 2>/dev/null
  else
    echo "skipped: no rankwatch plugin"
  fi
  if [[ -n "${RW_SO:-}" ]]; then
    gcc -O2 -std=gnu11 -I"$root/plugin/abi" "$bench/callback_steady.c" -o "$work/build/callback_steady" -ldl &&
      for r in 1 2 3; do
        echo "callback_steady round $r: rankwatch $(RANKWATCH_DUMP_DIR="$work/cbsteady-$r" "$work/build/callback_steady" "$RW_SO" 20000 7)" \
          "null $("$work/build/callback_steady" "$NULL_SO" 20000 7)"
      done | tee "$work/cbcost/steady.txt"
  fi
  t_cb=$((SECONDS - t_cb))

  step "torch_collectives.py under torchrun, rankwatch loaded"
  t_torch=$SECONDS
  local tdir="$work/torch"
  mkdir -p "$tdir/dump" "$tdir/expected"
  local -a launcher=(torchrun)
  command -v torchrun >/dev/null 2>&1 || launcher=("$PYTHON" -m torch.distributed.run)
  if [[ -n "${RW_SO:-}" ]]; then
    timeout -k 10 "${TORCH_TIMEOUT:-300}" env NCCL_PROFILER_PLUGIN="$RW_SO" \
      RANKWATCH_DUMP_DIR="$tdir/dump" RANKWATCH_GPU_TIMING=on \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROFILE \
      "${launcher[@]}" --standalone --nproc_per_node=2 "$here/torch_collectives.py" \
      --out "$tdir/expected" >"$tdir/torchrun.log" 2>&1
    torch_rc=$?
    echo "torchrun rc=$torch_rc (124 = timed out); log: torchrun.log in the tarball"
    grep -E "PROFILER/Plugin|[Pp]rofiler event mask|rankwatch" "$tdir/torchrun.log" | sort | uniq -c | head -n 12
    grep -E "wrote .*expected-rank" "$tdir/torchrun.log" || true
    if [[ $torch_rc -ne 0 ]]; then tail -n 30 "$tdir/torchrun.log"; fi
    ls -la "$tdir/dump" | head -n 12
  else
    echo "skipped: no rankwatch plugin"
  fi
  t_torch=$((SECONDS - t_torch))

  step "check_records.py"
  t_check=$SECONDS
  if ls "$tdir/expected"/expected-rank*.json >/dev/null 2>&1; then
    "$PYTHON" "$here/check_records.py" --dump "$tdir/dump" --expected "$tdir/expected" \
      --json "$tdir/check.json" >"$tdir/check.txt" 2>&1
    check_rc=$?
    cat "$tdir/check.txt"
    cp -f "$tdir/check.txt" "$OUT/check_records.txt"
  else
    echo "skipped: torch_collectives.py wrote no expected-rank*.json"
  fi
  t_check=$((SECONDS - t_check))

  step "rankwatch run -- torchrun (the installed wheel's plugin, as a user runs it)"
  # Carried wheels (.whl/ at the repository root): rankwatch built on the CI-like
  # machine, and click. The plugin inside is the one pip users get.
  if compgen -G "$root/.whl/rankwatch-*.whl" >/dev/null; then
    mkdir -p "$work/rwrun/expected"
    "$PYTHON" -m pip install -q --no-index --no-deps --target "$work/site" "$root"/.whl/*.whl &&
      PYTHONPATH="$work/site" "$PYTHON" -m rankwatch plugin-path &&
      PYTHONPATH="$work/site" timeout -k 10 300 "$PYTHON" -m rankwatch run --dump-dir "$work/rwrun/dump" -- \
        "${launcher[@]}" --standalone --nproc_per_node=2 "$here/torch_collectives.py" \
        --out "$work/rwrun/expected" >"$work/rwrun.log" 2>&1
    echo "rankwatch run rc=$?"; tail -n 3 "$work/rwrun.log"
    "$PYTHON" "$here/check_records.py" --dump "$work/rwrun/dump" --expected "$work/rwrun/expected" \
      >"$work/rwrun/check.txt" 2>&1
    echo "check_records on the rankwatch run: rc=$?"; grep -E "^summary:| FAIL *$" "$work/rwrun/check.txt" | head
  else
    echo "skipped: no wheels carried in .whl/"
  fi

  step "CUDA-graph job wall time, with and without rankwatch (interleaved)"
  # The PyTorch job above captures an all_reduce in a CUDA graph; with kernel
  # timing on, NCCL adds a host callback to every replay and calls the plugin
  # from the callback thread. The job must not take longer to run or exit.
  local -a walls_none=() walls_rw=()
  for r in 1 2 3; do
    for cfg in none rankwatch; do
      local -a penv=()
      [[ $cfg == rankwatch ]] && penv=(NCCL_PROFILER_PLUGIN="$RW_SO" RANKWATCH_DUMP_DIR="$work/exit/$cfg-$r")
      mkdir -p "$work/exit/exp-$cfg-$r"
      local t0 t1
      t0=$(date +%s%N)
      timeout -k 10 120 env ${penv[@]+"${penv[@]}"} "${launcher[@]}" --standalone --nproc_per_node=2 \
        "$here/torch_collectives.py" --graph-replays 50 --out "$work/exit/exp-$cfg-$r" \
        >"$work/exit/$cfg-$r.log" 2>&1
      local rc=$?
      t1=$(date +%s%N)
      local ms=$(( (t1 - t0) / 1000000 ))
      echo "exit-time round $r $cfg rc=$rc wall_ms=$ms"
      if [[ $cfg == none ]]; then walls_none+=("$ms"); else walls_rw+=("$ms"); fi
    done
  done
  echo "exit-time wall ms: none=[${walls_none[*]}] rankwatch=[${walls_rw[*]}]" | tee "$work/exit/summary.txt"

  step "all_reduce latency sweep"
  t_sweep=$SECONDS
  local rounds="${SWEEP_ROUNDS:-}"
  if [[ -z "$rounds" ]]; then
    rounds=5
    if ((SECONDS > 200)); then rounds=3; echo "earlier steps took ${SECONDS}s: 3 rounds"; fi
  fi
  local configs="none null-0x46 null-0x6 rankwatch rankwatch-sampled rankwatch-off"
  [[ -n "${RW_SO:-}" ]] || configs="none null-0x46 null-0x6"
  mkdir -p "$work/sweep"
  OUT="$work" SWEEP_DIR="$work/sweep" BUILD_DIR="$work/build" ROUNDS="$rounds" \
    CONFIGS="$configs" bash "$here/latency_sweep.sh" | tee "$work/sweep/table.txt"
  sweep_rc=${PIPESTATUS[0]}
  cp -f "$work/sweep/sweep.jsonl" "$OUT/sweep.jsonl" 2>/dev/null
  t_sweep=$((SECONDS - t_sweep))

  step "saving results"
  # Everything small; sweep op records (about 25k per rankwatch run, ~1 KB each) stay out.
  tar -czf "$OUT/rankwatch-bench.tar.gz" -C "$work" \
    --exclude='build/cmake' --exclude='build/rankwatch/cmake' --exclude='build/cb' \
    --exclude='*.o' --exclude='sweep/dumps/*/*.log' . 2>&1 | tail -n 3
  local sample="$work/sweep/dumps/rankwatch-r1"
  if compgen -G "$sample/*.log" >/dev/null; then
    tar -czf "$OUT/sweep-dump-sample.tar.gz" -C "$work/sweep/dumps" rankwatch-r1
  fi
  for f in "$OUT"/*.tar.gz; do
    [[ -f "$f" ]] || continue
    local sz
    sz=$(stat -c %s "$f")
    echo "$(basename "$f"): $((sz / 1024)) KiB"
    if ((sz > 15 * 1024 * 1024)); then
      echo "  over 15 MiB: removed (it would not come back)"
      rm -f "$f"
    fi
  done

  {
    echo "===================== rankwatch GPU bench summary ====================="
    nvidia-smi -L 2>/dev/null | head -n 4
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null
    echo "plugin load lines:"
    grep -hE "PROFILER/Plugin: Loaded|Profiler event mask" "$tdir/torchrun.log" 2>/dev/null | sed 's/^/  /' | sort | uniq -c | head -n 4
    echo
    printf '%-34s %-8s %s\n' step rc seconds
    printf '%-34s %-8s %s\n' build "$build_rc" "$t_build"
    printf '%-34s %-8s %s\n' "callback_cost" "$cb_rc" "$t_cb"
    printf '%-34s %-8s %s\n' "torch_collectives (torchrun)" "$torch_rc" "$t_torch"
    printf '%-34s %-8s %s\n' "check_records (0 = all PASS)" "$check_rc" "$t_check"
    printf '%-34s %-8s %s\n' "latency sweep ($rounds rounds)" "$sweep_rc" "$t_sweep"
    echo
    if [[ -f "$tdir/check.txt" ]]; then
      grep -E "^summary:" "$tdir/check.txt"
      grep -E " (FAIL|WARN) *$" "$tdir/check.txt" | head -n 20
    fi
    echo
    sed -n '/^all_reduce latency/,/^$/p' "$work/sweep/table.txt" 2>/dev/null
    grep -E "^record counts:" "$work/sweep/table.txt" 2>/dev/null
    echo
    sed -n '/^callback cost/,/^worst/p' "$work/cbcost/table.txt" 2>/dev/null
    cat "$work/exit/summary.txt" 2>/dev/null
    grep -E "^summary:" "$work/rwrun/check.txt" 2>/dev/null | sed 's/^/rankwatch run check: /'
    cat "$work/cbcost/steady.txt" 2>/dev/null
    echo "total ${SECONDS}s"
  } | tee "$OUT/summary.txt"
}

main 2>&1 | tee "$OUT/run_device.log"
rc=${PIPESTATUS[0]}
if [[ "${KEEP_WORK:-0}" == 1 ]]; then
  echo "scratch kept: $work"
else
  rm -rf "$work"
fi
exit "$rc"
