#!/usr/bin/env bash
# Straggler detection's cost: two agents on loopback as two nodes, 2 ranks each of
# tests/agent straggle_worker (one all_reduce per step, 1 ms sleep per step, global rank 2 sleeping
# 5 ms more), run for SECONDS with each agent binary given; prints, per binary, the CPU seconds
# each agent used (with its guard process; not its workers), the
# collectives per second, and (where the agent logs them at debug level) the mean bytes of one
# arrivals publication per node. Asserts nothing.
#   bash bench/agent/straggler_cost.sh WORKER SECONDS AGENT [AGENT...]
#   e.g. bash bench/agent/straggler_cost.sh bazel-bin/tests/agent/straggle_worker 30 \
#          bazel-bin/operator-agent/tdist-agent /work/main/bazel-bin/operator-agent/tdist-agent
set -euo pipefail

# cpu_s GUARD_PID: CPU seconds so far of the agent's guard (the pid started) and of the agent
# (the guard's only child; operator-agent/supervisor/guard.h), every thread, from
# /proc/PID/task/*/schedstat (nanoseconds, not ticks). Not the workers (the agent's children).
cpu_s() {
  local t s=0 p
  for p in "$1" $(pgrep -P "$1"); do
    for t in /proc/"$p"/task/*/schedstat; do s=$((s + $(cut -d' ' -f1 "$t"))); done
  done
  awk -v s="$s" 'BEGIN {print s / 1e9}'
}

# free_port: a port the kernel just gave out (closed again).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run_one AGENT SECONDS: one line of the table.
run_one() {
  local agent=$1 secs=$2 mp n p c0 c1 coll bytes
  mp=$(free_port)
  local pids=() id="cost-$$-$RANDOM"
  rm -f "$T"/port* "$T"/err*
  for n in 0 1; do
    TDIST_LOG_LEVEL=debug "$agent" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 \
      --master-port "$mp" --nproc-per-node 2 --run-id "$id" --http-port 0 \
      --http-port-file "$T/port$n" --log-dir "$T" -- "$WORKER" 100000000 1000 2 5000 \
      >"$T/out$n" 2>"$T/err$n" &
    pids+=($!)
  done
  sleep 3 # start-up, not counted
  c0=$(cpu_s "${pids[0]}") c1=$(cpu_s "${pids[1]}")
  local s0
  s0=$(curl -sf "http://127.0.0.1:$(cat "$T/port0")/metrics" |
    awk '/^tdist_rank_last_seq\{rank="0"/ {print $2}')
  sleep "$secs"
  local e0 e1 s1
  e0=$(cpu_s "${pids[0]}") e1=$(cpu_s "${pids[1]}")
  s1=$(curl -sf "http://127.0.0.1:$(cat "$T/port0")/metrics" |
    awk '/^tdist_rank_last_seq\{rank="0"/ {print $2}')
  for p in "${pids[@]}"; do kill -TERM "$p"; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  coll=$(awk -v a="${s0:-0}" -v b="${s1:-0}" -v s="$secs" 'BEGIN {printf "%.0f", (b - a) / s}')
  bytes=$( (grep -h 'arrivals: published' "$T/err0" "$T/err1" || true) |
    awk '{for (i = 1; i <= NF; i++) if ($i == "published") {s += $(i + 1); n++}}
         END {if (n) printf "%.0f", s / n; else print "-"}')
  printf '%-40s %14.2f %14.2f %8s %14s\n' "$agent" \
    "$(awk -v a="$c0" -v b="$e0" -v s="$secs" 'BEGIN {print (b - a) / s * 1000}')" \
    "$(awk -v a="$c1" -v b="$e1" -v s="$secs" 'BEGIN {print (b - a) / s * 1000}')" "$coll" "$bytes"
}

main() {
  [ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
  WORKER=$(realpath "$1")
  local secs=$2
  shift 2
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
  printf '%-40s %14s %14s %8s %14s\n' agent "node0 CPU ms/s" "node1 CPU ms/s" "coll/s" "bytes/publish"
  local a
  for a in "$@"; do run_one "$(realpath "$a")" "$secs"; done
}

main "$@"
