#!/usr/bin/env bash
# Build the rankwatch profiler plugin from plugin/ for benchmarking.
#
#   bash bench/build_rankwatch.sh OUT_DIR
#
# Writes OUT_DIR/libnccl-profiler-rankwatch.so and prints its path on the last line
# of stdout. Uses cmake when it is installed (RW_BUILD=gcc forces plain gcc), else
# compiles plugin/src/*.c with gcc and the same flags as plugin/CMakeLists.txt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:?usage: build_rankwatch.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
so="$out/libnccl-profiler-rankwatch.so"
how="${RW_BUILD:-auto}"

gcc_build() {
  echo "build_rankwatch: gcc build of $root/plugin/src" >&2
  gcc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -fno-strict-aliasing -pthread \
    -I"$root/plugin/abi" -I"$root/plugin/src" -D_GNU_SOURCE -DRANKWATCH_VERSION='"bench"' \
    "$root"/plugin/src/*.c -o "$so" -Wl,--no-undefined -ldl -lm
}

cmake_build() {
  echo "build_rankwatch: cmake build of $root/plugin" >&2
  cmake -S "$root/plugin" -B "$out/cmake" -DCMAKE_BUILD_TYPE=Release \
    -DRANKWATCH_VERSION=bench >&2 || return 1
  cmake --build "$out/cmake" -j "$(nproc 2>/dev/null || echo 4)" >&2 || return 1
  local built
  built="$(find "$out/cmake" -name 'libnccl-profiler-rankwatch.so' -type f | head -n 1)"
  [[ -n "$built" ]] || { echo "build_rankwatch: cmake produced no .so" >&2; return 1; }
  cp -f "$built" "$so"
}

rm -f "$so"
if [[ "$how" != gcc ]] && command -v cmake >/dev/null 2>&1; then
  cmake_build || { echo "build_rankwatch: cmake build failed; trying plain gcc" >&2; gcc_build; }
else
  gcc_build
fi

# The .so must export the profiler tables NCCL looks up.
if command -v nm >/dev/null 2>&1; then
  syms="$(nm -D --defined-only "$so" | awk '{print $3}' | grep -E '^ncclProfiler_v[0-9]+$' | tr '\n' ' ')"
  echo "build_rankwatch: exports: ${syms:-none}" >&2
  [[ "$syms" == *ncclProfiler_v5* ]] || { echo "build_rankwatch: no ncclProfiler_v5 in $so" >&2; exit 1; }
fi
echo "$so"
