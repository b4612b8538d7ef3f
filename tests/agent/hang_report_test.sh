#!/usr/bin/env bash
# The hang report for an unmodified PyTorch job (issue 37's acceptance), with the PyTorch of
# $TDIST_TORCH (1.13 or 2.6, tests/testlib/torch.sh): two agents on this host as two nodes x 2
# workers run hang_ddp.py (DDP on gloo, nothing of tdist in it) with a 2 s stall threshold, in one
# job (each node judges its own ranks); once every rank is in its training loop:
#   a. rank 2 (node 1's local rank 0) is stopped with SIGSTOP: node 1's /status "hang" names rank 2,
#      reason "stopped", its threads with their state and wchan; rank 3's Python stack (taken
#      without stopping it) is there, and so is rank 2's, read from its memory (a stopped
#      process runs no handler; operator-agent/pystack/pyframes.h), showing hang_ddp.py's main;
#   b. rank 1 (node 0's local rank 1) spins in Python (TDIST_TEST_SPIN_RANK), in the same job:
#      node 0's /status
#      names rank 1, reason "spinning", and its Python stack shows tdist_test_spin_forever; rank
#      0's stack shows where it waits (DDP's backward);
# the other ranks are not stopped (state S or R, alive), and /metrics of each node has
# the process series of both its ranks. The time from "every rank training" to the report is
# printed (never asserted: CI is loaded); each wait has a deadline.
#   args: AGENT HANG_DDP_SCRIPT
set -uo pipefail
AGENT="$(realpath "$1")"; SCRIPT="$(realpath "$2")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/torch.sh" # PY, TORCH_TAG, free_port
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, agent_test_end, agent_started, agent_kill_all
T="${TEST_TMPDIR:-$(mktemp -d)}/hang.$$"
mkdir -p "$T"
STOPPED=""
cleanup() {
  local p
  for p in $STOPPED; do kill -CONT "$p" 2>/dev/null; done
  agent_kill_all
}
trap cleanup EXIT
export TDIST_LOG_LEVEL=info TDIST_STALL_REPORT_SECONDS=2

# status NODE / metrics NODE: the endpoint of that node's agent ("" until it answers).
endpoint() {
  local p
  p="$(cat "$T/$CASE.port$1" 2>/dev/null)" || return 0
  [ -n "$p" ] && curl -sf --max-time 5 "http://127.0.0.1:$p/$2" 2>/dev/null
}

# start_job CASE [VAR=VALUE...]: two agents, 2 workers each, with the extra environment.
start_job() {
  CASE="$1"
  shift
  local port n
  port=$(free_port)
  mkdir -p "$T/$CASE.ready"
  for n in 0 1; do
    env "$@" TDIST_TEST_READY_DIR="$T/$CASE.ready" "$AGENT" --nnodes 2 --node-rank $n \
      --master-addr 127.0.0.1 --master-port "$port" --nproc-per-node 2 --run-id "hang-$CASE-$$" \
      --http-port 0 --http-port-file "$T/$CASE.port$n" --monitor-interval 0.1 --max-restarts 0 \
      --log-dir "$T" -- "$SCRIPT" >"$T/$CASE.$n.out" 2>"$T/$CASE.$n.err" &
    agent_started $!
    eval "APID$n=$APID"
  done
}

# all_ready: 0 once the 4 ranks wrote their pids (they are at the hang step), within 120 s
# (four interpreters importing torch on a loaded machine).
all_ready() {
  for _ in $(seq 1200); do
    [ "$(find "$T/$CASE.ready" -name 'rank*' -size +0 | wc -l)" -eq 4 ] && return 0
    sleep 0.1
  done
  return 1
}
pid_of_rank() { cat "$T/$CASE.ready/rank$1"; }

# wait_hang NODE RANK NEEDLE: polls NODE's /status (60 s at most) until its hang object names
# RANK and its python_stacks hold NEEDLE; leaves that /status in $T/$CASE.status.
wait_hang() {
  local js
  for _ in $(seq 600); do
    js="$(endpoint "$1" status)"
    if [ -n "$js" ] && echo "$js" | $PY -c '
import json, sys
h = json.load(sys.stdin).get("hang") or {}
sys.exit(0 if h.get("rank") == int(sys.argv[1]) and sys.argv[2] in json.dumps(h) else 1)' \
      "$2" "$3" 2>/dev/null; then
      echo "$js" >"$T/$CASE.status"
      return 0
    fi
    sleep 0.1
  done
  echo "$js" >"$T/$CASE.status"
  return 1
}

# check_status CASE_LETTER: the hang object's contents against what the test expects (a python
# program over the saved /status; each line it prints is a pass or a fail).
check_status() {
  $PY - "$T/$CASE.status" "$@" <<'PYEOF'
import json, re, sys
path, letter, rank, reason, peer, rank_stack_state, rank_needle, peer_needle = sys.argv[1:9]
h = json.load(open(path))["hang"]
rank, peer = int(rank), int(peer)
def out(ok, msg):
    print(("PASS: " if ok else "FAIL: ") + letter + ". " + msg)
out(h["reason"] == reason, "reason %r (want %r): %s" % (h["reason"], reason, h["detail"]))
held = [r for r in h["ranks"] if r["rank"] == rank]
out(bool(held) and held[0]["role"] == "holding" and held[0]["threads"]
    and all("wchan" in t and "state" in t for t in held[0]["threads"]),
    "rank %d's threads with state and wchan: %s" % (
        rank, [(t["state"], t["wchan"]) for t in (held[0]["threads"] if held else [])]))
waiting = [r for r in h["ranks"] if r["rank"] == peer]
waits = [t["wchan"] for t in (waiting[0]["threads"] if waiting else [])]
out(bool(waiting) and waiting[0]["role"] == "waiting"
    and any(re.search("futex|poll|epoll|recv|wait", w) for w in waits),
    "rank %d waits on it in the kernel: %s" % (peer, waits))
st = {s["rank"]: s for s in h.get("python_stacks", [])}
mine = st.get(rank, {})
out(mine.get("status") == rank_stack_state and rank_needle in json.dumps(mine),
    "rank %d's Python stack %s with %r: %s" % (rank, rank_stack_state, rank_needle,
                                               json.dumps(mine)[:400]))
theirs = st.get(peer, {})
out(theirs.get("status") == "taken" and peer_needle in (theirs.get("stacks") or ""),
    "rank %d's Python stack (taken while it waits) shows %r: %s" % (
        peer, peer_needle, (theirs.get("stacks") or "")[:400]))
PYEOF
}

# check_others CASE_LETTER "RANKS": every rank but those is alive and not stopped.
check_others() {
  local r p s bad=""
  for r in 0 1 2 3; do
    case " $2 " in *" $r "*) continue ;; esac
    p="$(pid_of_rank $r)"
    s="$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)"
    case "$s" in S | R) ;; *) bad="$bad rank $r (pid $p) state '$s'" ;; esac
  done
  [ -z "$bad" ] && pass "$1. the other ranks run or sleep (not stopped, alive)" ||
    fail "$1. other ranks:$bad"
}

# check_metrics CASE_LETTER: each node's /metrics has the process series of its two ranks.
check_metrics() {
  local n r m miss=""
  for n in 0 1; do
    m="$(endpoint $n metrics)"
    for r in $((2 * n)) $((2 * n + 1)); do
      for s in tdist_rank_cpu_seconds_total tdist_rank_resident_memory_bytes tdist_rank_threads \
        tdist_rank_process_state tdist_rank_context_switches_total tdist_rank_io_bytes_total; do
        grep -q "^$s{.*rank=\"$r\"" <<<"$m" || miss="$miss node$n:$s{rank=$r}"
      done
    done
  done
  [ -z "$miss" ] && pass "$1. /metrics: every rank's process series" || fail "$1. missing:$miss"
}

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

stop_job() {
  local n p
  for p in $STOPPED; do kill -CONT "$p" 2>/dev/null; done
  STOPPED=""
  for n in 0 1; do
    p="$(eval echo "\$APID$n")"
    kill -TERM "$p" 2>/dev/null
  done
  for n in 0 1; do
    p="$(eval echo "\$APID$n")"
    for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
}

# One job holds both cases (each node judges its own ranks): rank 1 spins from the hang step
# on, and once every rank is there rank 2 is stopped.
start_job ab TDIST_TEST_SPIN_RANK=1
if all_ready; then
  t0=$(date +%s.%N)
  p2="$(pid_of_rank 2)"
  kill -STOP "$p2"; STOPPED="$p2"
  # b. rank 1 spins in Python: node 0 names it, with its stack and rank 0's.
  if wait_hang 0 1 tdist_test_spin_forever; then
    echo "b. rank 1 named $(since "$t0") s after every rank reached the step where it spins (threshold 2 s)"
    check_status b 1 spinning 0 taken tdist_test_spin_forever backward
  else
    fail "b. node 0 never named rank 1 with its stack: $(head -c 3000 "$T/ab.status")"
    tail -5 "$T/ab.0.err"
  fi
  # a. rank 2 stopped: node 1 names it, with rank 3's stack.
  if wait_hang 1 2 train_step; then
    echo "a. rank 2 named $(since "$t0") s after SIGSTOP (threshold 2 s)"
    check_status a 2 stopped 3 taken "in main" train_step
  else
    fail "a. node 1 never named rank 2 with its peer's stacks: $(head -c 3000 "$T/ab.status")"
    tail -5 "$T/ab.1.err"
  fi
  check_others a,b "1 2"
  check_metrics a,b
else
  fail "the ranks did not all start training: $(tail -3 "$T/ab.0.err" "$T/ab.1.err")"
fi
stop_job

agent_test_end "hang_report_test ($TORCH_TAG)"
