#!/usr/bin/env bash
# Real-training validation on the GPU machine (2 GPUs): the rankwatch wheel's plugin
# enabled through `rankwatch run`, a ~370 M-parameter transformer trained with DDP and
# FSDP (bench/gpu/train_lm.py), injected faults, PyTorch Profiler traces, and a JAX
# program. Analysis happens afterwards, on any machine, from what lands in $OUT:
#
#   OUT=/some/dir bash bench/gpu/run_validation.sh [RUN...]
#
# RUN names (default: all): ddp-healthy ddp-gpu ddp-host ddp-hang fsdp-healthy fsdp-gpu
# ddp-gpu-profiled jax jax-gpu jax-gpu-live. Needs the rankwatch wheel (and click's) in .whl/ at the
# repository root.
#
# $OUT afterwards:
#   validation.log        everything printed
#   records.tar.gz        per run: the dump directory (records, Prometheus files) and the
#                         job's own files (truth, steps, issued collectives)
#   traces.tar.gz[.NN]    PyTorch Profiler traces of ddp-gpu-profiled (split at 15 MiB)
#   summary.txt           a table: run, rc, wall seconds, records per rank, median step ms
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/gpu/common.sh
source "$here/common.sh"
gpu_start validation.log rankwatch-validation
export TORCH_NCCL_TRACE_BUFFER_SIZE=20000
runs_dir="$work/runs"
mkdir -p "$runs_dir"

launcher() {
  if command -v torchrun >/dev/null 2>&1; then echo torchrun; else echo "$PYTHON -m torch.distributed.run"; fi
}

# train NAME TIMEOUT_S ARGS...: one torchrun job through `rankwatch run`
train() {
  local name=$1 limit=$2
  shift 2
  local dir="$runs_dir/$name"
  mkdir -p "$dir"
  local t0=$SECONDS rc
  # shellcheck disable=SC2046  # the launcher is one or three words
  timeout -k 10 "$limit" "$PYTHON" -m rankwatch run --dump-dir "$dir/dump" -- \
    $(launcher) --standalone --nproc_per_node=2 "$here/train_lm.py" --out "$dir/job" "$@" \
    >"$dir/job.log" 2>&1
  rc=$?
  pkill -f "train_lm.py --out $dir/job" 2>/dev/null && sleep 2
  echo "$name rc=$rc wall_s=$((SECONDS - t0))" | tee -a "$work/rcs.txt"
  tail -n 4 "$dir/job.log"
}

# job NAME TIMEOUT_S RUN_OPTION -- SCRIPT ARGS...: one Python job through `rankwatch run`
# (RUN_OPTION: --monitor, or - for none); its output goes to NAME/job.log
job() {
  local name=$1 limit=$2 option=$3
  shift 4
  local dir="$runs_dir/$name" script=$1
  shift
  mkdir -p "$dir"
  local t0=$SECONDS rc monitor=()
  [[ $option == --monitor ]] && monitor=(--monitor)
  timeout -k 10 "$limit" "$PYTHON" -m rankwatch run "${monitor[@]}" --dump-dir "$dir/dump" -- \
    "$PYTHON" "$here/$script" --out "$dir/job" "$@" >"$dir/job.log" 2>&1
  rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - t0))" | tee -a "$work/rcs.txt"
  tail -n 12 "$dir/job.log"
}

do_run() {
  case $1 in
    ddp-healthy) train ddp-healthy 240 --steps 50 --graph-metric ;;
    ddp-gpu) train ddp-gpu 240 --steps 50 --fault gpu --fault-step 25 ;;
    ddp-host) train ddp-host 240 --steps 50 --fault host --fault-step 25 ;;
    # the hang: ended from outside 20 s after training reaches it
    ddp-hang) train ddp-hang 75 --steps 50 --fault hang --fault-step 25 ;;
    fsdp-healthy) train fsdp-healthy 240 --parallel fsdp --steps 50 ;;
    fsdp-gpu) train fsdp-gpu 240 --parallel fsdp --steps 50 --fault gpu --fault-step 25 ;;
    ddp-gpu-profiled)
      train ddp-gpu-profiled 240 --steps 26 --fault gpu --fault-step 20 --profile-steps 17:23 ;;
    jax) job jax 300 - -- jax_collectives.py ;;
    # one process driving both GPUs, GPU 1 slow from step 30
    jax-gpu) job jax-gpu 300 - -- jax_straggler.py --steps 60 --slow-device 1 --slow-from 30 ;;
    # the same under the monitor, long enough for it to go live: findings in job.log
    jax-gpu-live)
      job jax-gpu-live 300 --monitor -- jax_straggler.py --steps 20000 --slow-device 1 \
        --slow-from 10000 ;;
    *) echo "unknown run $1" ;;
  esac
}

summarize() {
  "$PYTHON" - "$runs_dir" "$work/rcs.txt" <<'EOF'
import glob, json, os, statistics, sys
runs, rcs = sys.argv[1], sys.argv[2]
rc = dict(l.split(" ", 1) for l in open(rcs).read().splitlines() if l)
print(f"{'run':18} {'rc/wall':18} {'records per file':28} {'median step ms':>14}")
for name in sorted(os.listdir(runs)):
    d = os.path.join(runs, name)
    recs = [sum(1 for _ in open(f)) for f in sorted(glob.glob(f"{d}/dump/*.log"))]
    med = []
    for f in sorted(glob.glob(f"{d}/job/steps-rank*.jsonl")):
        st = [json.loads(l) for l in open(f)]
        if st:
            med.append(statistics.median((s["end_ns"] - s["start_ns"]) / 1e6 for s in st[3:] or st))
    print(f"{name:18} {rc.get(name, '?'):18} {str(recs):28} {str([round(m, 1) for m in med]):>14}")
EOF
}

main() {
  step "machine"
  nvidia-smi -L
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version())'
  "$PYTHON" -c 'import jax; print("jax", jax.__version__)' 2>&1 | tail -n 1
  command -v nsys && nsys --version
  step "install the rankwatch wheel"
  install_wheels || { echo "wheel install failed"; return 1; }
  local runs=("$@")
  ((${#runs[@]})) || runs=(ddp-healthy ddp-gpu ddp-host ddp-hang fsdp-healthy fsdp-gpu ddp-gpu-profiled jax jax-gpu jax-gpu-live)
  for r in "${runs[@]}"; do
    step "run $r"
    do_run "$r"
  done
  step "summary"
  summarize | tee "$OUT/summary.txt"
  step "saving"
  tar -czf "$OUT/records.tar.gz" -C "$runs_dir" --exclude='*/job/trace' .
  if compgen -G "$runs_dir/*/job/trace/*" >/dev/null; then
    tar -czf "$work/traces.tar.gz" -C "$runs_dir" $(cd "$runs_dir" && ls -d */job/trace)
    split -b 15M -d "$work/traces.tar.gz" "$OUT/traces.tar.gz."
  fi
  ls -la "$OUT"
}

main "$@"
