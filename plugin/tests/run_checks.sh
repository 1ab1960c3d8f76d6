#!/bin/sh
# Run every fake_nccl scenario against one plugin and fail on any error or
# sanitizer report. Used by `make check`, `make check-asan`, `make check-tsan`.
#
#   run_checks.sh DRIVER PLUGIN [CAPTURE_DIR]
#
# Environment: STRESS_SECONDS (default 10), sanitizer *_OPTIONS from the caller,
# STREAM_RECEIVER (stream_sink_receiver; without it the streaming runs are skipped).
# ECHO_* variables only matter to the echo plugin; other plugins ignore them.
set -u
DRIVER=$1
PLUGIN=$2
CAPTURE_DIR=${3:-}
STRESS_SECONDS=${STRESS_SECONDS:-10}

if [ ! -x "$DRIVER" ] || [ ! -f "$PLUGIN" ]; then
  echo "run_checks: missing driver '$DRIVER' or plugin '$PLUGIN'" >&2
  exit 2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/rw-checks.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
export RANKWATCH_DUMP_DIR="$TMP/dump"
mkdir -p "$RANKWATCH_DUMP_DIR"
export ECHO_LOG="$TMP/echo.log"
FAILED=0
SANITIZER_PATTERN='ERROR: AddressSanitizer|ERROR: LeakSanitizer|WARNING: ThreadSanitizer|ERROR: ThreadSanitizer|runtime error:|SUMMARY: UndefinedBehaviorSanitizer'

# True when $1 holds exactly one line of JSON.
one_json_line() {
  python3 -c 'import json,sys; L=open(sys.argv[1]).read().splitlines(); assert len(L)==1, L; json.loads(L[0])' "$1" 2>/dev/null
}

report() { # name status errfile
  if [ "$2" = ok ]; then
    echo "ok   $1"
  else
    echo "FAIL $1 ($2)"
    tail -n 40 "$3" | sed 's/^/     | /'
    FAILED=$((FAILED + 1))
  fi
}

check_outputs() { # name rc outfile errfile
  if grep -Eq "$SANITIZER_PATTERN" "$4"; then
    report "$1" "sanitizer report" "$4"
  elif [ "$2" -ne 0 ]; then
    report "$1" "exit $2" "$4"
  elif ! one_json_line "$3"; then
    report "$1" "stdout is not one JSON line" "$4"
  else
    report "$1" ok "$4"
  fi
}

run() { # name [VAR=value...] -- driver args...
  name=$1
  shift
  envs=""
  while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
  shift
  # shellcheck disable=SC2086
  env $envs "$DRIVER" "$PLUGIN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  check_outputs "$name" $? "$TMP/$name.out" "$TMP/$name.err"
}

run basic -- --scenario basic --ops 14
run basic-v4 -- --scenario basic --abi 4
run basic-v6 -- --scenario basic --abi 6
run p2p -- --scenario p2p --ops 9 --nranks 4 --rank 1
run coalesced -- --scenario coalesced
run graph -- --scenario graph --ops 4
run graph-v4 -- --scenario graph --abi 4
run multicomm -- --scenario multicomm
run workload -- --scenario workload
run workload-mask4095 ECHO_MASK=0xfff -- --scenario workload
run workload-nokernelch ECHO_MASK=0x6 -- --scenario workload
run workload-mask0 ECHO_MASK=0 -- --scenario workload
run concurrent-init -- --scenario concurrent-init --threads 8 --comms 3 --ops 3
run robustness -- --scenario robustness
run robustness-v4 -- --scenario robustness --abi 4
run robustness-v6 ECHO_MASK=0x7fff -- --scenario robustness --abi 6
run robustness-optout ECHO_OPTOUT=1 -- --scenario robustness
run null-handles ECHO_NULL_MASK=0x30f -- --scenario workload
run abort -- --scenario abort
run cycles -- --scenario workload --cycles 3
run cycles-keep-loaded -- --scenario multicomm --cycles 3 --keep-loaded
run stress -- --scenario stress --seconds "$STRESS_SECONDS" --threads 4 --comms 3

# A two-rank job through the rendezvous, rank 1 slow on the GPU from step 3.
job() { # name extra-args...
  name=$1
  shift
  for r in 0 1; do
    "$DRIVER" "$PLUGIN" --scenario job --rank $r --nranks 2 --comm-id 0xfeedface12345678 \
      --steps 8 --rendezvous "$TMP/rdv-$name" --slow-rank 1 --slow-from-step 3 \
      --interval-sleep-us 200 "$@" >"$TMP/$name-$r.out" 2>"$TMP/$name-$r.err" &
    eval "pid$r=\$!"
  done
  wait "$pid0"; rc0=$?
  wait "$pid1"; rc1=$?
  check_outputs "$name-rank0" $rc0 "$TMP/$name-0.out" "$TMP/$name-0.err"
  check_outputs "$name-rank1" $rc1 "$TMP/$name-1.out" "$TMP/$name-1.err"
}
for cause in host gpu transfer; do
  mkdir -p "$TMP/rdv-job-$cause"
  job "job-$cause" --slow-cause $cause --slow-us 3000
done

# A hang: rank 1 stops at step 2 with a kernel that never starts; rank 0 must
# stay blocked in that step. Both are killed once rank 1 has printed its summary.
mkdir -p "$TMP/rdv-hang"
for r in 0 1; do
  extra=""
  [ $r = 1 ] && extra="--hang-at-step 2"
  # shellcheck disable=SC2086
  "$DRIVER" "$PLUGIN" --scenario job --rank $r --nranks 2 --comm-id 0xdeadbeef00000001 \
    --steps 6 --rendezvous "$TMP/rdv-hang" $extra >"$TMP/hang-$r.out" 2>"$TMP/hang-$r.err" &
  eval "hpid$r=\$!"
done
i=0
while [ $i -lt 200 ] && ! one_json_line "$TMP/hang-1.out"; do sleep 0.1; i=$((i + 1)); done
sleep 1
if one_json_line "$TMP/hang-1.out" && kill -0 "$hpid0" 2>/dev/null &&
  grep -q '"hung":true' "$TMP/hang-1.out"; then
  status=ok
else
  status="rank 1 did not report the hang or rank 0 finished"
fi
kill "$hpid0" "$hpid1" 2>/dev/null
wait "$hpid0" 2>/dev/null
wait "$hpid1" 2>/dev/null
cat "$TMP/hang-0.err" "$TMP/hang-1.err" >"$TMP/hang.err"
grep -Eq "$SANITIZER_PATTERN" "$TMP/hang.err" && status="sanitizer report"
report job-hang "$status" "$TMP/hang.err"

# The streaming sink (RANKWATCH_COLLECTOR) against stream_sink_receiver, which
# checks every frame it gets: one that closes each connection after a few frames
# (the sink reconnects with backoff while threads churn communicators), one over
# TCP across plugin unload/reload cycles, and one that never reads (the queue
# fills, batches are dropped, exit stays bounded). With a plugin that writes no
# records (the echo plugin) only the frame checks apply.
stream() { # name min-connections receiver-args... -- driver args...
  name=stream-$1
  min_conn=$2
  shift 2
  rargs=""
  while [ "$1" != "--" ]; do rargs="$rargs $1"; shift; done
  shift
  dir="$TMP/$name"
  mkdir -p "$dir/dump"
  # shellcheck disable=SC2086
  "$STREAM_RECEIVER" --ready "$dir/addr" --out "$dir/rx.json" --seconds 300 $rargs \
    2>"$dir/rx.err" &
  rpid=$!
  i=0
  while [ $i -lt 200 ] && [ ! -s "$dir/addr" ]; do sleep 0.05; i=$((i + 1)); done
  RANKWATCH_DUMP_DIR="$dir/dump" RANKWATCH_COLLECTOR="$(cat "$dir/addr" 2>/dev/null)" \
    RANKWATCH_STREAM_QUEUE_BYTES=128K "$DRIVER" "$PLUGIN" "$@" >"$TMP/$name.out" \
    2>"$TMP/$name.err"
  rc=$?
  kill "$rpid" 2>/dev/null
  wait "$rpid"
  if grep -Eq "$SANITIZER_PATTERN" "$TMP/$name.err" || [ $rc -ne 0 ] ||
    ! one_json_line "$TMP/$name.out"; then
    check_outputs "$name" $rc "$TMP/$name.out" "$TMP/$name.err"
    return
  fi
  verdict=$(python3 - "$dir" "$min_conn" "$rargs" <<'PY'
import glob, json, os, sys
d, min_conn, stall = sys.argv[1], int(sys.argv[2]), "--stall" in sys.argv[3]
try:
    rx = json.load(open(os.path.join(d, "rx.json")))
except (OSError, ValueError) as exc:
    print(f"no receiver summary: {exc}")
    sys.exit()
recording = bool(glob.glob(os.path.join(d, "dump", "*.rwstate.jsonl")))
if rx["errors"]:
    print(f"receiver: {rx['errors']} errors, first: {rx['first_error']}")
elif recording and rx["connections"] < min_conn:
    print(f"receiver: {rx['connections']} connections, expected >= {min_conn}")
elif recording and not stall and rx["hellos"] != rx["connections"]:
    print(f"receiver: {rx['hellos']} hellos for {rx['connections']} connections")
else:
    print("ok")
PY
)
  if [ "$verdict" = ok ]; then
    report "$name" ok "$TMP/$name.err"
  else
    cp "$dir/rx.json" "$TMP/$name.rx" 2>/dev/null
    report "$name" "$verdict" "$TMP/$name.err"
  fi
}
if [ -n "${STREAM_RECEIVER:-}" ] && [ -x "$STREAM_RECEIVER" ]; then
  stream reconnect 2 --listen "unix:$TMP/stream-reconnect/rx.sock" --close-after 8 -- \
    --scenario stress --seconds 4 --threads 2 --comms 2
  stream tcp-cycles 1 --listen tcp -- --scenario workload --cycles 3
  stream stall 1 --listen "unix:$TMP/stream-stall/rx.sock" --stall -- \
    --scenario basic --ops 3000
else
  echo "skip stream (no STREAM_RECEIVER)"
fi

if [ -n "$CAPTURE_DIR" ] && [ -d "$CAPTURE_DIR" ]; then
  for gz in "$CAPTURE_DIR"/mask*/trace-*.txt.gz; do
    [ -e "$gz" ] || continue
    sub=$(basename "$(dirname "$gz")")
    plain="$TMP/$sub-$(basename "$gz" .gz)"
    gunzip -c "$gz" >"$plain"
    run "replay-$sub-$(basename "$gz" .txt.gz)" -- --scenario replay --replay "$plain"
    last="$plain"
  done
  if [ -n "${last:-}" ]; then
    run replay-realtime-v4 -- --scenario replay --replay "$last" --replay-realtime --abi 4
    run replay-cycles-v6 -- --scenario replay --replay "$last" --cycles 3 --abi 6
  fi
else
  echo "skip replay (no capture dir '$CAPTURE_DIR')"
fi

if [ "$FAILED" -ne 0 ]; then
  echo "run_checks: $FAILED FAILED"
  exit 1
fi
echo "run_checks: all passed"
