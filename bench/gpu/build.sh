#!/usr/bin/env bash
# Build the GPU benchmark kit on the GPU machine.
#
#   BUILD_DIR=DIR bash bench/gpu/build.sh
#
# Builds, into BUILD_DIR (default bench/.build/gpu):
#   allreduce_latency          linked against the NCCL of the Python environment
#                              (the one PyTorch loads) and the CUDA runtime
#   null_plugin.so             the do-nothing profiler plugin (bench/null_plugin.c)
#   callback_cost              the CPU callback benchmark (bench/callback_cost.c)
#   rankwatch/libnccl-profiler-rankwatch.so   from plugin/ (bench/build_rankwatch.sh)
# and writes BUILD_DIR/paths.env (shell variables naming them) for the other scripts.
#
# Environment: NCCL_HOME (a directory with include/nccl.h and lib/libnccl.so.2;
# default: found in the Python environment), CUDA_HOME (default /usr/local/cuda),
# PYTHON (default python3), SKIP_RANKWATCH=1 to skip the plugin build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench="$(cd "$here/.." && pwd)"
root="$(cd "$bench/.." && pwd)"
PYTHON="${PYTHON:-python3}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
build="${BUILD_DIR:-$bench/.build/gpu}"
mkdir -p "$build"
build="$(cd "$build" && pwd)"

find_nccl() {
  "$PYTHON" - <<'EOF'
import os, site, sys

def ok(p):
    return p and os.path.isfile(os.path.join(p, "include", "nccl.h")) and \
        os.path.isfile(os.path.join(p, "lib", "libnccl.so.2"))

cands = []
try:
    import nvidia.nccl as m  # a namespace package in the cu13 wheels: __file__ may be None
    cands += list(getattr(m, "__path__", []))
    if getattr(m, "__file__", None):
        cands.append(os.path.dirname(m.__file__))
except Exception:
    pass
dirs = []
try:
    dirs += site.getsitepackages()
except Exception:
    pass
try:
    dirs.append(site.getusersitepackages())
except Exception:
    pass
dirs += sys.path
cands += [os.path.join(d, "nvidia", "nccl") for d in dirs if d]
for c in cands:
    if ok(c):
        print(os.path.realpath(c))
        break
EOF
}

nccl="${NCCL_HOME:-}"
if [[ -z "$nccl" ]]; then nccl="$(find_nccl || true)"; fi
if [[ -z "$nccl" || ! -f "$nccl/include/nccl.h" ]]; then
  echo "build.sh: cannot find NCCL (nvidia/nccl with include/nccl.h) in the Python environment;" \
    "set NCCL_HOME" >&2
  exit 1
fi
nccl_lib="$nccl/lib"
echo "build.sh: NCCL from $nccl" >&2
echo "build.sh: CUDA from $CUDA_HOME" >&2

# libnccl.so.2 only: link through an unversioned symlink in the build directory.
mkdir -p "$build/ncclink"
ln -sf "$nccl_lib/libnccl.so.2" "$build/ncclink/libnccl.so"

gcc -std=c11 -O2 -Wall -Wextra -I"$CUDA_HOME/include" -I"$nccl/include" \
  "$here/allreduce_latency.c" -o "$build/allreduce_latency" \
  -L"$build/ncclink" -lnccl -L"$CUDA_HOME/lib64" -lcudart \
  -Wl,-rpath,"$nccl_lib" -Wl,-rpath,"$CUDA_HOME/lib64"
echo "build.sh: built $build/allreduce_latency" >&2

gcc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -I"$root/plugin/abi" \
  "$bench/null_plugin.c" -o "$build/null_plugin.so"
gcc -std=c11 -O2 -Wall -Wextra -I"$root/plugin/abi" "$bench/callback_cost.c" \
  -o "$build/callback_cost" -pthread -ldl
echo "build.sh: built $build/null_plugin.so $build/callback_cost" >&2

rw_so=""
if [[ "${SKIP_RANKWATCH:-0}" != 1 ]]; then
  rw_so="$(bash "$bench/build_rankwatch.sh" "$build/rankwatch" | tail -n 1)"
  echo "build.sh: built $rw_so" >&2
fi

cat >"$build/paths.env" <<EOF
NCCL_HOME_FOUND=$(printf '%q' "$nccl")
NCCL_LIB_DIR=$(printf '%q' "$nccl_lib")
ALLREDUCE_BIN=$(printf '%q' "$build/allreduce_latency")
NULL_SO=$(printf '%q' "$build/null_plugin.so")
CALLBACK_COST_BIN=$(printf '%q' "$build/callback_cost")
RW_SO=$(printf '%q' "$rw_so")
EOF
echo "build.sh: wrote $build/paths.env" >&2
