#!/usr/bin/env bash
# shellcheck disable=SC2154 # PID_<scenario><node> are set by start() through eval
# Restart accounting across nodes (issue 35, item 6): what torchrun gets wrong, over real agents
# (one host, one agent per node rank, each with one worker, a shell script that logs every start
# and waits for the test to make it fail or finish).
#   a. --max-restarts is a job-wide budget (pytorch#147064): with --max-restarts 2 and 3 nodes, a
#      worker failure on node 2, then node 1's agent killed with SIGKILL and started again at
#      once, twice: the job runs attempts 0, 1 and 2 only, and on the third failure every agent
#      gives up ("giving up after 2 restart(s)"). torchrun counts max_restarts per agent
#      (api.py, _invoke_run: only the agent whose own workers failed decrements
#      _remaining_restarts; the others restart on num_nodes_waiting > 0 without counting) and a
#      rejoined agent starts with a full budget, so there it runs attempt 3 and on without end.
#   b. TORCHELASTIC_RESTART_COUNT is the same on every node in every attempt (pytorch#108158):
#      an elastic job (--nnodes 2:3) starts on nodes 0 and 1, node 2 joins late, node 2's agent
#      is then killed and replaced, then a worker fails on node 1: every node's worker sees
#      count k in attempt k (0 on two nodes, then 1, 2, 3 on all three, the late and the replaced
#      agent included), and every agent's /status shows the same round and restart_count. In
#      torchrun restart_count = max_restarts - _remaining_restarts of each agent: the healthy
#      nodes keep 0 and a new agent starts at 0.
#   c. a warm spare counted in PET_NNODES (--spares-in-nnodes, Trainer v2's shape): 3 pods, 2
#      active, the standby takes the stopped node 1's group rank with count 1.
#   args: AGENT
set -uo pipefail
AGENT="$(realpath "$1")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/ports.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/ports.sh" # free_port
T="${TEST_TMPDIR:-$(mktemp -d)}/accounting.$$"
mkdir -p "$T"
PY=/usr/bin/python3
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started
trap agent_kill_all EXIT
export TDIST_LOG_LEVEL=info

# The worker: one line per start "node count group_rank rank round_port" into $T/<scenario>.starts,
# then exit 3 once $T/<scenario>.fail.<node>.<count> exists, 0 once $T/<scenario>.finish does.
cat >"$T/worker.sh" <<'EOF'
#!/bin/bash
# A worker of restart_accounting_test: logs its start, then fails or finishes when told.
set -u
echo "$RA_NODE $TORCHELASTIC_RESTART_COUNT $GROUP_RANK $RANK $MASTER_PORT" >>"$RA_DIR/$RA_SC.starts"
while :; do
  [ -e "$RA_DIR/$RA_SC.fail.$RA_NODE.$TORCHELASTIC_RESTART_COUNT" ] && exit 3
  [ -e "$RA_DIR/$RA_SC.finish" ] && exit 0
  sleep 0.05
done
EOF
chmod +x "$T/worker.sh"

# start SC NODE ARGS...: starts node NODE's agent of scenario SC in the background; its pid (the
# guard's) in PID_<SC><NODE>, its HTTP port in $T/SC.NODE.port. A restarted node appends to
# the same log.
start() {
  local sc=$1 n=$2
  shift 2
  rm -f "$T/$sc.$n.port"
  RA_DIR="$T" RA_SC="$sc" RA_NODE="$n" "$AGENT" --node-rank "$n" --master-addr 127.0.0.1 \
    --nproc-per-node 1 --run-id "ra-$sc-$$" --http-port 0 --http-port-file "$T/$sc.$n.port" \
    --monitor-interval 0.05 --stop-grace-period 5 --rdzv-timeout 60 --log-dir "$T" "$@" \
    -- "$T/worker.sh" >>"$T/$sc.$n.out" 2>>"$T/$sc.$n.err" &
  agent_started $!
  eval "PID_$sc$n=$!"
}
# starts_with SC COUNT: the nodes (sorted) whose workers started with TORCHELASTIC_RESTART_COUNT
# COUNT in scenario SC.
starts_with() {
  awk -v c="$2" '$2 == c {print $1}' "$T/$1.starts" 2>/dev/null | sort | tr '\n' ' '
}
# wait_starts SC COUNT NODES: waits (90 s at most) for as many new starts in scenario SC as NODES
# ("0 1 2 ") names, then 0 when exactly NODES started with COUNT. SEEN_<SC>: starts so far.
wait_starts() {
  local seen="SEEN_$1" want
  want=$((${!seen:-0} + $(echo "$3" | wc -w)))
  for _ in $(seq 900); do
    [ "$( (wc -l <"$T/$1.starts") 2>/dev/null || echo 0)" -ge "$want" ] && break
    sleep 0.1
  done
  eval "SEEN_$1=$want"
  [ "$(starts_with "$1" "$2")" = "$3" ]
}
# last_starts SC N: the last N starts of SC ("node count" each), for failure messages.
last_starts() { tail -n "$2" "$T/$1.starts" 2>/dev/null | awk '{printf "node %s count %s; ", $1, $2}'; }
# kill_agent PID: SIGKILL to the agent under the guard PID (no goodbye: its workers die with
# it), then waits for the guard to exit.
kill_agent() {
  local a
  a="$(pgrep -P "$1" -x tdist-agent)"
  [ -n "$a" ] && kill -KILL "$a"
  for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  wait "$1" 2>/dev/null
}
# wait_exits SECS PID...: waits up to SECS seconds in all for every PID to exit; RC_<i> holds
# the status of the i-th (0-based), "running" for one still running at the deadline.
wait_exits() {
  local secs=$1 i left
  shift
  for i in $(seq 0 $(($# - 1))); do eval "RC_$i=running"; done
  for _ in $(seq $((secs * 10))); do
    left=0
    i=0
    for p in "$@"; do
      local v="RC_$i"
      if [ "${!v}" = running ]; then
        if kill -0 "$p" 2>/dev/null; then left=1; else wait "$p"; eval "RC_$i=$?"; fi
      fi
      i=$((i + 1))
    done
    [ $left = 0 ] && return 0
    sleep 0.1
  done
  return 1
}
# status_of SC NODE: "round restart_count" from node NODE's /status.
status_of() {
  local p
  p="$(cat "$T/$1.$2.port" 2>/dev/null)" && [ -n "$p" ] &&
    curl -sf --max-time 5 "http://127.0.0.1:$p/status" 2>/dev/null |
    $PY -c 'import json,sys; s=json.load(sys.stdin); print(s["round"], s["restart_count"])'
}
# same_status SC COUNT NODES...: every node's /status has restart_count COUNT and one round.
same_status() {
  local sc=$1 c=$2 n seen="" s
  shift 2
  for n in "$@"; do
    s="$(status_of "$sc" "$n")"
    seen="$seen node $n: ${s:-none};"
    [ "${s#* }" = "$c" ] || { fail "$sc. attempt $c: /status restart_count:$seen"; return; }
  done
  [ "$(for n in "$@"; do status_of "$sc" "$n" | cut -d' ' -f1; done | sort -u | wc -l)" = 1 ] &&
    pass "$sc. attempt $c: every agent's /status shows round ${s%% *}, restart_count $c" ||
    fail "$sc. attempt $c: the agents disagree on the round:$seen"
}

# a. a job-wide budget: --max-restarts 2, three failures on two different nodes.
MP=$(free_port)
for n in 0 1 2; do start a $n --nnodes 3 --master-port "$MP" --max-restarts 2; done
if wait_starts a 0 "0 1 2 "; then
  pass "a. attempt 0 runs on nodes 0, 1, 2"
  touch "$T/a.fail.2.0" # 1: node 2's worker exits 3
  if wait_starts a 1 "0 1 2 "; then
    pass "a. a worker failure on node 2: attempt 1 on every node"
    kill_agent "$PID_a1" # 2: node 1's agent dies and is back at once, with a budget of its own
    start a 1 --nnodes 3 --master-port "$MP" --max-restarts 2
    if wait_starts a 2 "0 1 2 "; then
      pass "a. node 1's agent killed and restarted at once: attempt 2 on every node"
      kill_agent "$PID_a1" # 3: the same again: the job's budget is spent
      start a 1 --nnodes 3 --master-port "$MP" --max-restarts 2
      wait_exits 60 "$PID_a0" "$PID_a1" "$PID_a2"
      [ -z "$(starts_with a 3)" ] && pass "a. no attempt 3 started anywhere" ||
        fail "a. attempt 3 started on node(s) $(starts_with a 3): the budget was bypassed"
      [ "$RC_0" = 70 ] && [ "$RC_2" = 70 ] && [ "$RC_1" != running ] && [ "$RC_1" != 0 ] &&
        pass "a. every agent gave up (exit $RC_0, $RC_1, $RC_2)" ||
        fail "a. exit status $RC_0, $RC_1, $RC_2 (want 70, non-zero, 70)"
      grep -q "giving up after 2 restart(s) (--max-restarts 2)" "$T/a.0.err" &&
        pass "a. node 0: 'giving up after 2 restart(s) (--max-restarts 2)'" ||
        fail "a. node 0 does not say it gave up: $(tail -3 "$T/a.0.err")"
    else fail "a. attempt 2: want nodes 0 1 2 with count 2, got: $(last_starts a 3)"; fi
  else fail "a. attempt 1: want nodes 0 1 2 with count 1, got: $(last_starts a 3)"; fi
else fail "a. attempt 0: want nodes 0 1 2 with count 0, got: $(last_starts a 3)"; fi
agent_kill_all
# shellcheck disable=SC2034 # read by agent_kill_all (lib.sh)
AGENT_PIDS=()

# b. one count on every node: elastic 2:3, a late joiner, a replaced agent, a worker failure.
# --last-call 8: round 0 closes with nodes 0 and 1; later rounds fill up (3) before it passes.
MP=$(free_port)
B=(--nnodes 2:3 --last-call 8 --master-port "$MP" --max-restarts 10)
for n in 0 1; do start b $n "${B[@]}"; done
if wait_starts b 0 "0 1 "; then
  pass "b. attempt 0 runs on nodes 0, 1"
  same_status b 0 0 1
  start b 2 "${B[@]}" # joins late: a scale-up
  if wait_starts b 1 "0 1 2 "; then
    pass "b. node 2 joined late: attempt 1 on every node, node 2 included"
    same_status b 1 0 1 2
    kill_agent "$PID_b2" # replaced: a fresh agent for node 2
    start b 2 "${B[@]}"
    if wait_starts b 2 "0 1 2 "; then
      pass "b. node 2's agent replaced: attempt 2 on every node, the new agent included"
      same_status b 2 0 1 2
      touch "$T/b.fail.1.2"
      if wait_starts b 3 "0 1 2 "; then
        pass "b. a worker failure on node 1: attempt 3 on every node"
        same_status b 3 0 1 2
        touch "$T/b.finish"
        wait_exits 60 "$PID_b0" "$PID_b1" "$PID_b2"
        [ "$RC_0 $RC_1 $RC_2" = "0 0 0" ] && pass "b. every node exits 0" ||
          fail "b. exit status $RC_0, $RC_1, $RC_2 (want 0 0 0; running: still running 60 s on)"
      else fail "b. attempt 3: want nodes 0 1 2 with count 3, got: $(last_starts b 3)"; fi
    else fail "b. attempt 2: want nodes 0 1 2 with count 2, got: $(last_starts b 3)"; fi
  else fail "b. attempt 1: want nodes 0 1 2 with count 1, got: $(last_starts b 3)"; fi
else fail "b. attempt 0: want nodes 0 1 with count 0, got: $(last_starts b 2)"; fi
# Every start of scenario b, whatever it was: each (node, count) once, counts 0..3 only.
extra="$(awk '{print $1, $2}' "$T/b.starts" 2>/dev/null | sort | uniq -c | awk '$1 != 1 || $3 > 3')"
[ -z "$extra" ] && pass "b. no worker started twice in one attempt or in an attempt past 3" ||
  fail "b. unexpected starts (count node attempt): $extra"

# c. a warm spare counted in the node count, as under Kubeflow Trainer v2 (PET_NNODES = numNodes
# = 3 pods, spares_in_nnodes, 1 spare): nodes 0 and 1 train, node 2 waits; node 1's agent is
# stopped (SIGTERM, as on pod deletion) and node 2 takes its group rank 1 in attempt 1. Which
# pods train is who comes first (as under Trainer, where the spare is whichever pod is last), so
# node 2 starts once nodes 0 and 1 train: started together, node 2 came before node 1 in one
# loaded run and trained in its place.
MP=$(free_port)
for n in 0 1; do
  PET_NNODES=3 PET_NODE_RANK=$n start c "$n" --master-port "$MP" --max-restarts 3 --spares 1 \
    --spares-in-nnodes
done
if wait_starts c 0 "0 1 "; then
  PET_NNODES=3 PET_NODE_RANK=2 start c 2 --master-port "$MP" --max-restarts 3 --spares 1 \
    --spares-in-nnodes
  pass "c. PET_NNODES=3 with 1 spare counted in it: attempt 0 runs on nodes 0 and 1"
  st=""
  for _ in $(seq 100); do
    p="$(cat "$T/c.2.port" 2>/dev/null)"
    st="$(curl -sf --max-time 5 "http://127.0.0.1:$p/status" 2>/dev/null |
      $PY -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)"
    [ "$st" = standby ] && break
    sleep 0.1
  done
  [ "$st" = standby ] && pass "c. node 2's /status says standby" || fail "c. node 2's state: '$st'"
  kill -TERM "$PID_c1"
  if wait_starts c 1 "0 2 "; then
    pass "c. node 1 stopped: attempt 1 on nodes 0 and 2 (the standby promoted)"
    grep -q "^2 1 1 " "$T/c.starts" && pass "c. the promoted standby has group rank 1" ||
      fail "c. the promoted standby's start: $(grep '^2 ' "$T/c.starts")"
    touch "$T/c.finish"
    wait_exits 60 "$PID_c0" "$PID_c1" "$PID_c2"
    [ "$RC_0 $RC_1 $RC_2" = "0 143 0" ] && pass "c. exit status 0, 143 (stopped), 0" ||
      fail "c. exit status $RC_0, $RC_1, $RC_2 (want 0 143 0)"
  else fail "c. attempt 1: want nodes 0 2 with count 1, got: $(last_starts c 2)"; fi
else fail "c. attempt 0: want nodes 0 1 with count 0, got: $(last_starts c 2)"; fi

[ "$fails" -eq 0 ] || for f in "$T"/*.err; do echo "== $f"; tail -20 "$f"; done
agent_test_end restart_accounting_test
