# Shared start of the GPU scripts (run_device.sh, run_validation.sh, run_final.sh):
#
#   here=...; source "$here/common.sh"; gpu_start LOG_NAME WORK_PREFIX
#
# gpu_start: requires $OUT (made absolute), sends all output to $OUT/LOG_NAME as well
# (none when LOG_NAME is empty), exports the NVLink-multicast-off settings, and sets
# $root, $PYTHON and a scratch directory $work.
# shellcheck shell=bash

step() { echo; echo "=== [$(date +%H:%M:%S) +${SECONDS}s] $*"; }

gpu_start() {
  local log=$1 prefix=$2
  root="$(cd "$here/../.." && pwd)"
  : "${OUT:?set OUT to the output directory}"
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  if [[ -n "$log" ]]; then
    exec > >(tee -a "$OUT/$log") 2>&1
  fi
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export PYTHONUNBUFFERED=1
  PYTHON="${PYTHON:-python3}"
  work="$(mktemp -d "${TMPDIR:-/tmp}/$prefix.XXXXXX")"
}

# The rankwatch wheel and its missing dependencies (.whl/ at the repository root) into
# $work/site, put first on PYTHONPATH.
install_wheels() {
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$work/site" "$root"/.whl/*.whl || return 1
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  "$PYTHON" -m rankwatch --version && "$PYTHON" -m rankwatch plugin-path
}
