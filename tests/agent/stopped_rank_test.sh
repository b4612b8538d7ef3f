#!/usr/bin/env bash
# A SIGSTOPped rank is named as the root cause (issue 14, item 8). The C training example
# trains with a short collective deadline (--timeout-ms); once every rank is past its first
# collectives the test sends SIGSTOP to one rank, the others time out in their all_reduce and
# exit 3, and the agent must blame the stopped rank, not the first rank that timed out:
#   a. one agent, 3 workers, rank 1 stopped: the root-cause line and the job's failure record
#      ("giving up ...") name rank 1 with its pid as stopped; the exit status is the first failed
#      worker's (3); the stopped worker is continued with the agent's SIGTERM and exits within the
#      grace period (no SIGKILL), and no worker is left;
#   b. two agents as two nodes (ranks 0,1 on node 0, rank 2 on node 1), rank 2 stopped: node 0
#      blames the rank of its own that timed out (it cannot see rank 2's state), and node 1,
#      whose only worker failed nothing, says at the end of the round that rank 2 was stopped.
#   args: AGENT TRAIN_BIN
set -uo pipefail
AGENT="$(realpath "$1")"; TRAIN="$(realpath "$2")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/ports.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/ports.sh" # free_port
T="${TEST_TMPDIR:-$(mktemp -d)}/stopped.$$"
mkdir -p "$T"
PY=/usr/bin/python3
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
cleanup() {
  local p
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
  for p in ${STOPPED:-}; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT
export TDIST_LOG_LEVEL=info
# Long enough to be still training when stopped; a deadline short enough to time out soon.
JOB=("$TRAIN" --steps 100000 --step-ms 20 --print-every 0 --timeout-ms 4000)

# status PORTFILE: /status of the agent whose HTTP port is in PORTFILE ("" until it answers).
status() {
  local p
  p="$(cat "$1" 2>/dev/null)" || return 0
  [ -n "$p" ] && curl -sf --max-time 5 "http://127.0.0.1:$p/status" 2>/dev/null
}
# pid_of PORTFILE RANK: pid of global rank RANK once every worker of that agent is running and
# past its first collective (its /status "collectives" summary counts a sequence number).
pid_of() {
  local js
  for _ in $(seq 300); do
    js="$(status "$1")"
    if [ -n "$js" ]; then
      echo "$js" | $PY -c '
import json, sys
s = json.load(sys.stdin)
ws = s.get("workers") or []
if ws and all(w["state"] == "running" for w in ws):
    for w in ws:
        if w["global_rank"] == int(sys.argv[1]):
            print(w["pid"])' "$2" && return 0
    fi
    sleep 0.1
  done
  return 1
}
# training PORTFILE: 0 once node 0's /status says where the ranks are (#N with N > 0).
training() {
  for _ in $(seq 300); do
    status "$1" | grep -q '"collectives": *"[^"]*#[1-9]' && return 0
    sleep 0.1
  done
  return 1
}
# wait_exit PID SECS: 0 once PID has exited (then `wait` it), 1 after SECS seconds.
wait_exit() {
  for _ in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

# a. one agent, three workers, rank 1 stopped.
"$AGENT" --standalone --nproc-per-node 3 --http-port 0 --http-port-file "$T/a.port" \
  --monitor-interval 0.05 --stop-grace-period 10 --log-dir "$T" -- "${JOB[@]}" \
  >"$T/a.out" 2>"$T/a.err" &
apid=$!
if training "$T/a.port" && p1="$(pid_of "$T/a.port" 1)" && [ -n "$p1" ]; then
  kill -STOP "$p1"; STOPPED="$p1"
  if wait_exit $apid 60; then
    wait $apid; rc=$?
    rc_line="$(grep 'worker failed (root cause)' "$T/a.err")"
    echo "root cause: $rc_line"
    case "$rc_line" in
      *"root cause): rank 1 (local_rank 1, pid $p1) is stopped"*)
        pass "a. the root cause names the stopped rank 1 (pid $p1)" ;;
      *) fail "a. root cause: '$rc_line' (want rank 1, pid $p1, stopped)" ;;
    esac
    grep 'giving up' "$T/a.err" | grep -q "rank 1 (local_rank 1, pid $p1) is stopped" &&
      pass "a. the job's failure record names it too" ||
      fail "a. failure record: $(grep 'giving up' "$T/a.err")"
    [ $rc -eq 3 ] && pass "a. exit status 3 (the first failed worker's code)" ||
      fail "a. exit status $rc, want 3"
    ! grep -q "sending SIGKILL" "$T/a.err" &&
      pass "a. the stopped worker was continued and exited on SIGTERM (no SIGKILL)" ||
      fail "a. the stopped worker needed SIGKILL: $(grep 'sending SIGKILL' "$T/a.err")"
    [ ! -e "/proc/$p1" ] || [ "$(awk '{print $3}' "/proc/$p1/stat" 2>/dev/null)" = Z ] &&
      pass "a. the stopped worker is gone" || fail "a. the stopped worker $p1 is still there"
  else
    fail "a. the agent did not exit within 60 s of SIGSTOP: $(tail -3 "$T/a.err")"
    kill -CONT "$p1"
  fi
else fail "a. the workers did not start training: $(tail -5 "$T/a.err")"; fi

# b. two nodes; the stopped rank is node 1's only worker.
MP=$(free_port)
for n in 0 1; do
  np=$((2 - n))
  "$AGENT" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$MP" \
    --nproc-per-node $np --run-id "stopped-$$" --http-port 0 --http-port-file "$T/b$n.port" \
    --monitor-interval 0.05 --stop-grace-period 10 --log-dir "$T" -- "${JOB[@]}" \
    >"$T/b$n.out" 2>"$T/b$n.err" &
  eval "bpid$n=$!"
done
# shellcheck disable=SC2154
if training "$T/b0.port" && p2="$(pid_of "$T/b1.port" 2)" && [ -n "$p2" ]; then
  kill -STOP "$p2"; STOPPED="$STOPPED $p2"
  if wait_exit "$bpid0" 60 && wait_exit "$bpid1" 60; then
    wait "$bpid0"; rc0=$?
    wait "$bpid1"; rc1=$?
    grep -q "worker failed (root cause): rank [01] (local_rank [01]) exited with code 3" "$T/b0.err" &&
      pass "b. node 0 blames its own rank that timed out" ||
      fail "b. node 0: $(grep 'root cause' "$T/b0.err")"
    grep -q "stopped (SIGSTOP, or a debugger holds it) when the round ended: rank 2 (local_rank 0, pid $p2)" \
      "$T/b1.err" && pass "b. node 1 says its rank 2 (pid $p2) was stopped when the round ended" ||
      fail "b. node 1: no 'stopped when the round ended' line: $(grep -E 'round 0 ended|stopped' "$T/b1.err")"
    [ $rc0 -eq 3 ] && [ $rc1 -eq 70 ] && pass "b. exit status 3 on node 0, 70 on node 1" ||
      fail "b. exit status $rc0 on node 0 (want 3), $rc1 on node 1 (want 70)"
  else
    fail "b. the agents did not exit within 60 s of SIGSTOP: $(tail -3 "$T/b1.err")"
    kill -CONT "$p2"
  fi
else fail "b. the workers did not start training: $(tail -5 "$T/b0.err"; tail -5 "$T/b1.err")"; fi

agent_test_end stopped_rank_test
