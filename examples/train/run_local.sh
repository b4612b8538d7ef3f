#!/usr/bin/env bash
# Starts N ranks of examples/train on this machine, the way torchrun would set them up, and waits
# for all of them:
#
#   bash examples/train/run_local.sh N [train options...]      (e.g. 2 --steps 300 --lr 0.05)
#
# Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
# free MASTER_PORT; rank 0 hosts the store there (env://). MASTER_ADDR / MASTER_PORT already set
# in the environment are used as given (e.g. a store an agent hosts, with
# TORCHELASTIC_USE_AGENT_STORE=True, which reaches the ranks like any other variable). Output
# lines are prefixed with the rank. If a rank fails, the others are stopped at once; if the run
# takes longer than TRAIN_TIMEOUT_S seconds (default 300) all are stopped. The exit status is the
# first failing rank's (0 when every rank succeeded). A port taken between choosing it and rank 0
# binding it is retried with another port, up to 4 times.
#
# TRAIN_BIN: the train binary to run; unset, it is built with `bazel build //examples/train:train`.
# Nothing is left running when this script returns.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: run_local.sh N [train options...]   (N ranks; train --help lists the options)" >&2
  exit 2
fi
nranks=$1
shift

bin="${TRAIN_BIN:-}"
if [[ -z "$bin" ]]; then
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  (cd "$root" && bazel build --color=no --curses=no //examples/train:train </dev/null >&2)
  bin="$(cd "$root" && bazel info bazel-bin 2>/dev/null)/examples/train/train"
fi
[[ -x "$bin" ]] || { echo "run_local.sh: $bin is not an executable" >&2; exit 2; }

master_addr="${MASTER_ADDR:-127.0.0.1}"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_run.XXXXXX")"
pids=()
cleanup() {
  for f in "$tmp"/pid.*; do [[ -e "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nobody listens on now, below the kernel's ephemeral range (a port there, such as one
# from bind(0), can be taken by any outgoing connection before rank 0 binds it): a random one
# that `ss` does not list; without `ss`, one the kernel picks.
free_port() {
  local lo p
  lo="$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)"
  [[ "$lo" =~ ^[0-9]+$ ]] && ((lo > 10100)) || lo=32768
  if command -v ss >/dev/null 2>&1; then
    for _ in $(seq 50); do
      p=$((10000 + (RANDOM * 32768 + RANDOM) % (lo - 10000)))
      if ! ss -Htan 2>/dev/null | awk '{print $4}' | grep -q ":$p\$"; then echo "$p"; return 0; fi
    done
  fi
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1; then
      "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
        && return 0
    fi
  done
  echo 29500
}

# One attempt: starts the ranks, waits; sets `status`.
run_once() {
  local port=$1 r deadline
  shift
  pids=()
  : >"$tmp/out"
  # Each rank runs in a pipeline whose last process (tee) exits only after the rank's output is
  # all written: waiting for it means no line arrives after this script returns. The rank's own
  # pid and exit status travel through files.
  rm -f "$tmp"/pid.* "$tmp"/rc.*
  for ((r = 0; r < nranks; r++)); do
    (
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=$nranks LOCAL_WORLD_SIZE=$nranks \
        MASTER_ADDR=$master_addr MASTER_PORT=$port "$bin" "$@" 2>&1 &
      echo $! >"$tmp/pid.$r"
      rc=0
      wait $! || rc=$?
      echo "$rc" >"$tmp/rc.$r"
    ) | sed -u "s/^/[rank $r] /" | tee -a "$tmp/out" &
    pids+=($!)
  done
  # kill_ranks SIGNAL: signals every rank process that is still there.
  kill_ranks() {
    local f
    for f in "$tmp"/pid.*; do [[ -e "$f" ]] && kill "-$1" "$(cat "$f")" 2>/dev/null || true; done
    return 0
  }
  deadline=$((SECONDS + ${TRAIN_TIMEOUT_S:-300}))
  status=0
  local left=$nranks
  local -A done=()
  while ((left > 0)); do
    for ((r = 0; r < nranks; r++)); do
      [[ -n "${done[$r]:-}" ]] && continue
      if ! kill -0 "${pids[$r]}" 2>/dev/null; then
        local rc=0
        wait "${pids[$r]}" 2>/dev/null || true
        rc="$(cat "$tmp/rc.$r" 2>/dev/null || echo 1)"
        done[$r]=1
        left=$((left - 1))
        if ((rc != 0 && status == 0)); then
          status=$rc
          echo "run_local.sh: rank $r exited with status $rc; stopping the other ranks" >&2
          kill_ranks TERM
        fi
      fi
    done
    if ((left > 0 && SECONDS > deadline)); then
      echo "run_local.sh: timed out after ${TRAIN_TIMEOUT_S:-300} s; stopping all ranks" >&2
      kill_ranks KILL
      ((status == 0)) && status=124
    fi
    ((left > 0)) && sleep 0.05
  done
  return 0
}

if [[ -n "${MASTER_PORT:-}" ]]; then
  # A store that someone else hosts (an agent: TORCHELASTIC_USE_AGENT_STORE=True) or a port
  # chosen by the caller: use it as given, no retry.
  echo "run_local.sh: $nranks ranks, MASTER_ADDR=$master_addr MASTER_PORT=$MASTER_PORT (given)" >&2
  run_once "$MASTER_PORT" "$@"
  exit "$status"
fi
port="$(free_port)"
echo "run_local.sh: $nranks ranks, MASTER_ADDR=$master_addr MASTER_PORT=$port" >&2
run_once "$port" "$@"
for _ in 1 2 3 4; do
  ((status != 0)) && grep -q "could not host the store" "$tmp/out" || break
  port="$(free_port)"
  echo "run_local.sh: port taken; retrying with MASTER_PORT=$port" >&2
  run_once "$port" "$@"
done
exit "$status"
