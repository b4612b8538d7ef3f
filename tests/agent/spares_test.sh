#!/usr/bin/env bash
# Warm spares (--spares) end to end: pods in network namespaces (tests/agent/pods/pods.sh, dnsmasq
# as the cluster DNS), 3 nodes + 2 spares (pods job-0..4, node ranks from JOB_COMPLETION_INDEX),
# each pod running tdist-agent; the workers are the C training example or, with
# TDIST_SPARES_WORKER=torch, the PyTorch DDP example (of $TDIST_TORCH). A lost node is a network
# cut (eth0 down) and then SIGKILL of everything in the pod: the peers see no FIN, only silence.
#   A. a member (job-1) is lost mid-training, with workers that ignore SIGTERM, so that the
#      healthy members need the 3 s grace period to stop them and reach the next round after both
#      standbys: the round waits for job-2 instead of giving its place away; one standby (job-3 or
#      job-4) takes group rank 1 (GROUP_RANK=1, RANK 1, TORCHELASTIC_RESTART_COUNT 1), the other
#      stays a standby, job-0 and job-2 keep theirs,
#      job-1's replacement pod becomes a standby; before the loss /status and /metrics show the
#      standbys (state "standby", tdist_standbys 2 on node 0); every pod exits 0 at the end, the
#      standbys left over included. Workers check attempt isolation (--check-fresh-store) also
#      after the promotion.
#   B. pod 0 (the store host) is lost: job-3 (node rank 3, the first spare's pod: the backup
#      store host) hosts the store, takes group rank 0, round 0's other members keep theirs;
#      pod 0's replacement (2 s after the loss, before the others noticed it) first hosts a store
#      of its own, then gives way and joins on job-3's as a standby; the job completes on
#      attempt 1, every pod exits 0.                                            [C workers only]
#   C. a standby (job-4) is lost while waiting: no restart, node 0 counts one standby fewer; its
#      replacement is counted again; every pod exits 0.                        [C workers only]
#   D. two members lost at once with one spare left: the next round waits for a third node; with
#      a replacement within --rdzv-timeout the job completes, without one every agent gives up
#      with exit 69 naming the wait.                                            [C workers only]
#   args: AGENT DDP_SCRIPT PODS_SH TRAIN_BIN
set -uo pipefail
AGENT="$(realpath "$1")"; DDP="$(realpath "$2")"; PODS_SH="$(realpath "$3")"; TRAIN="$(realpath "$4")"
WORKER="${TDIST_SPARES_WORKER:-c}"
T="${TEST_TMPDIR:-$(mktemp -d)}/spares.$$"; mkdir -p "$T"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
SEED="${TDIST_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}"
echo "spares_test: $WORKER workers, seed $SEED (TDIST_TEST_SEED=$SEED replays)"
if [ "$WORKER" = torch ]; then
  . "$LIB/torch.sh" # PY, TDIST_PYTHON
  job=("$PY" "$DDP" --steps 300 --step-sleep 0.03 --check-fresh-store --seed "$SEED")
  started="step  20"
else
  PY=/usr/bin/python3
  job=("$TRAIN" --steps 400 --step-ms 20 --print-every 20 --check-fresh-store --seed "$SEED")
  started="step     20"
fi
# shellcheck source=pods/pods.sh
source "$PODS_SH"
pods_init job svc ns cluster.local || exit 1
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
RDZV_TIMEOUT=60
SLOW_STOP=0 # 1: workers ignore SIGTERM (exec keeps it ignored): a member takes --stop-grace-period
            # (3 s) to stop its workers and rejoin, while standbys rejoin at once

# start_agent INDEX LOGNAME: (re)creates pod job-INDEX and runs the agent in it. The worker
# command logs the environment the agent gave it, then runs the job.
start_agent() {
  local i=$1 log=$2 ip
  ip=$(pods_start "job-$i") || return 1
  echo "pod job-$i is $ip ($log)"
  pods_exec "job-$i" JOB_COMPLETION_INDEX="$i" POD_NAMESPACE=ns SPARES_SLOW_STOP="$SLOW_STOP" -- \
    "$AGENT" --nnodes 3 --spares 2 --nproc-per-node 1 --max-restarts 3 --service svc \
      --master-port 29500 --heartbeat-interval 0.5 --heartbeat-timeout 3 \
      --rdzv-timeout "$RDZV_TIMEOUT" --stop-grace-period 3 --monitor-interval 0.1 --http-port 29600 \
      -- /bin/sh -c '[ "$SPARES_SLOW_STOP" = 1 ] && trap "" TERM; echo "worker env GROUP_RANK=$GROUP_RANK RANK=$RANK WORLD_SIZE=$WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT" >&2; exec "$@"' \
      sh "${job[@]}" >"$T/$log.log" 2>&1
  agent_in_pod "$i"
}

# lose NAME...: the nodes vanish: network first (no FIN reaches the peers), then every process.
lose() {
  local n
  for n in "$@"; do ip -n "$(pods_netns "$n")" link set eth0 down; done
  for n in "$@"; do pods_kill "$n" KILL >/dev/null; done
}

# finish INDEX...: waits for those agents; each must exit 0 within 90 s.
finish() {
  local i rc ok=1
  for i in "$@"; do
    if ! timeout 90 tail --pid="${APID[$i]}" -f /dev/null; then ok=0; echo "agent job-$i still running after 90 s"; continue; fi
    wait "${APID[$i]}"; rc=$?
    [ $rc -eq 0 ] || { ok=0; echo "agent job-$i exited $rc"; }
  done
  [ $ok = 1 ]
}

# http NAME PATH: from pod job-0's peer view, GET http://NAME.svc:29600/PATH
http() { PODS_FG_TIMEOUT=10 pods_exec_fg job-2 -- curl -s "http://$1.svc:29600/$2"; }

# prom NAME METRIC: the value of one sample of NAME's /metrics ("" if absent)
prom() { http "$1" metrics | awk -v k="$2" '$1 == k { print $2 }'; }

# standbys_on_0 WANT SECONDS: node 0's tdist_standbys reaches WANT
standbys_on_0() {
  local i v
  for ((i = 0; i < $2 * 2; i++)); do
    v=$(prom job-0 tdist_standbys); [ "$v" = "$1" ] && return 0; sleep 0.5
  done
  echo "node 0's tdist_standbys is '$v', want $1"; return 1
}

start_all() {
  local name=$1 i
  for i in 0 1 2 3 4; do start_agent $i "$name.$i" || { fail "$name: pod start"; return 1; }; done
  if ! pods_wait_for "$T/$name.0.log" "$started" 90; then
    fail "$name: training did not start"; tail -20 "$T/$name".*.log; return 1
  fi
}

cleanup_pods() { local n; for n in $(pods_list); do pods_kill "$n" KILL >/dev/null 2>&1; done; }

# dump NAME: the agents' own lines of scenario NAME (what a failure in CI leaves to read).
dump() { local f; for f in "$T/$1".*.log; do echo "== $f"; grep -v '^step\|^train' "$f" | tail -60; done; }

# check_final NAME LOG ATTEMPT_RE: node 0's last lines say the job trained to the end.
check_final() {
  if [ "$WORKER" = torch ]; then
    grep -q "params identical: True" "$2" && grep -qE "done: world 3 attempt $3 " "$2"
  else
    grep -qE "train: OK: .*bitwise identical on all 3 ranks \(attempt $3\)" "$2"
  fi && pass "$1: training completed on attempt $3 with identical parameters" ||
    fail "$1: no final line (attempt $3) in $2: $(tail -3 "$2")"
}

scenario_a() {
  SLOW_STOP=1
  start_all A || { SLOW_STOP=0; return; }
  SLOW_STOP=0
  local st
  st=$(http job-3 status)
  echo "$st" | $PY -c 'import json,sys; s=json.load(sys.stdin); assert s["state"]=="standby" and s["group_rank"]==-1 and s["workers"]==[] and s["spares"]==2, s' &&
    pass "A: /status of job-3 says standby, no workers" || fail "A: job-3 /status: $st"
  [ "$(prom job-4 'tdist_agent_state{state="standby"}')" = 1 ] &&
    pass "A: job-4's /metrics has tdist_agent_state{state=\"standby\"} 1" || fail "A: job-4 state metric: $(prom job-4 'tdist_agent_state{state="standby"}')"
  standbys_on_0 2 10 && pass "A: node 0 counts 2 standbys (tdist_standbys)" || fail "A: standby count"
  st=$(http job-0 status)
  echo "$st" | $PY -c 'import json,sys; s=json.load(sys.stdin); assert sorted(m["node_rank"] for m in s["standbys"])==[3,4] and s["standbys_live"]==2, s' &&
    pass "A: node 0's /status lists standbys 3 and 4" || fail "A: node 0 /status standbys: $st"
  echo "losing pod job-1"
  lose job-1
  wait "${APID[1]}" 2>/dev/null
  local want="worker env GROUP_RANK=1 RANK=1 WORLD_SIZE=3 restart=1" up='' other i
  for ((i = 0; i < 300 && !${#up}; i++)); do
    grep -q "$want" "$T/A.3.log" && up=3
    grep -q "$want" "$T/A.4.log" && up=${up:-4}
    [ -n "$up" ] || sleep 0.1
  done
  if [ -n "$up" ]; then
    pass "A: the standby job-$up took group rank 1 (GROUP_RANK=1 RANK=1 restart count 1)"
  else fail "A: no standby promoted: $(grep -h 'worker env' "$T"/A.[34].log)"; fi
  other=$((up == 3 ? 4 : 3))
  # The replacement pod comes after the promotion (one that came back within the heartbeat
  # timeout would rejoin the round with its own node rank and take group rank 1 back).
  start_agent 1 A.1.new || { fail "A: restart pod"; return; }
  pods_wait_for "$T/A.0.log" "worker env GROUP_RANK=0 RANK=0 WORLD_SIZE=3 restart=1" 30 &&
    pods_wait_for "$T/A.2.log" "worker env GROUP_RANK=2 RANK=2 WORLD_SIZE=3 restart=1" 30 &&
    pass "A: job-0 and job-2 kept group ranks 0 and 2" || fail "A: healthy nodes' ranks: $(grep -h 'worker env' "$T"/A.[02].log)"
  if pods_wait_for "$T/A.1.new.log" "standby (no workers)" 30; then pass "A: job-1's replacement is a standby"
  else fail "A: job-1's replacement: $(tail -3 "$T/A.1.new.log")"; fi
  if [ -n "$up" ]; then
    grep -q "worker env" "$T/A.$other.log" && fail "A: job-$other ran workers too" ||
      pass "A: job-$other stayed a standby"
  fi
  if finish 0 2 3 4 1; then pass "A: all five agents exited 0, the standbys left over included"
  else fail "A: agents failed"; dump A; fi
  check_final A "$T/A.0.log" 1
  cleanup_pods
}

scenario_b() {
  start_all B || return
  # Round 0's group ranks of job-1, job-2 and job-4 (those that were members).
  local -A g0
  local i g
  for i in 1 2 4; do
    g=$(sed -n 's/^worker env GROUP_RANK=\([0-9]*\) .*restart=0$/\1/p' "$T/B.$i.log" | head -1)
    [ -n "$g" ] && g0[$i]=$g
  done
  echo "losing pod job-0 (the store host); round 0's other members: ${!g0[*]} (group ranks ${g0[*]})"
  lose job-0
  wait "${APID[0]}" 2>/dev/null
  # The replacement comes 2 s later, before the others noticed the loss (3 s heartbeat timeout):
  # it finds no store on job-3 yet and hosts one, then gives way once job-3's round runs.
  sleep 2
  start_agent 0 B.0.new || { fail "B: restart pod"; return; }
  if pods_wait_for "$T/B.3.log" "worker env GROUP_RANK=0 RANK=0 WORLD_SIZE=3 restart=1" 30; then
    pass "B: the backup store host job-3 hosts the store and took group rank 0 (RANK 0, restart count 1)"
  else fail "B: job-3 did not take over: $(grep -h 'store\|worker env' "$T/B.3.log" | tail -5)"; fi
  local kept=1
  for i in "${!g0[@]}"; do
    [ "$i" = 3 ] && continue
    pods_wait_for "$T/B.$i.log" "worker env GROUP_RANK=${g0[$i]} RANK=${g0[$i]} WORLD_SIZE=3 restart=1" 15 ||
      { kept=0; echo "job-$i: $(grep -h 'worker env' "$T/B.$i.log")"; }
  done
  [ $kept = 1 ] && pass "B: round 0's other members kept their group ranks on the new store" ||
    { fail "B: healthy members' group ranks changed"; dump B; }
  if pods_wait_for "$T/B.0.new.log" "standby (no workers)" 30 &&
    grep -q "runs the job's current round\|has the job's latest round\|the job runs on the store of pod 3" "$T/B.0.new.log"; then
    pass "B: job-0's replacement joined the job on job-3's store as a standby"
  else fail "B: job-0's replacement: $(grep -v '^step' "$T/B.0.new.log" | tail -4)"; fi
  if finish 0 1 2 3 4; then pass "B: all five agents exited 0 after the store host was lost"
  else fail "B: agents failed"; dump B; fi
  check_final B "$T/B.3.log" 1
  cleanup_pods
}

scenario_c() {
  start_all C || return
  standbys_on_0 2 10 || { fail "C: standbys before"; }
  echo "losing the standby job-4"
  lose job-4
  wait "${APID[4]}" 2>/dev/null
  standbys_on_0 1 15 && pass "C: node 0 counts 1 standby after job-4 was lost" || fail "C: count after loss"
  start_agent 4 C.4.new || { fail "C: restart pod"; return; }
  standbys_on_0 2 15 && pass "C: job-4's replacement is counted again" || fail "C: count after replacement"
  if finish 0 1 2 3 4; then pass "C: all agents exited 0"; else fail "C: agents failed"; dump C; fi
  grep -q "round .* ended" "$T"/C.0.log && fail "C: a round ended: $(grep 'round .* ended' "$T/C.0.log")" ||
    pass "C: losing a standby restarted nothing"
  check_final C "$T/C.0.log" 0
  cleanup_pods
}

scenario_d() {
  start_all D1 || return
  echo "losing the standby job-4, then members job-1 and job-2 at once: one spare (job-3) left"
  lose job-4 job-1 job-2
  wait "${APID[1]}" "${APID[2]}" "${APID[4]}" 2>/dev/null
  pods_wait_for "$T/D1.0.log" "round 0 ended" 30 || fail "D1: node 0 did not end round 0"
  sleep 3
  grep -q "worker env" <(sed -n '/round 0 ended/,$p' "$T/D1.0.log") &&
    fail "D1: workers started with 2 of 3 nodes" || pass "D1: no workers while 2 of 3 nodes are there"
  start_agent 1 D1.1.new || { fail "D1: restart pod"; return; }
  if finish 0 1 3; then pass "D1: two members lost with one spare: the job waited for a replacement and completed"
  else fail "D1: agents failed"; dump D1; fi
  check_final D1 "$T/D1.0.log" "[1-9]"
  cleanup_pods

  RDZV_TIMEOUT=8
  start_all D2 || { RDZV_TIMEOUT=60; return; }
  lose job-4 job-1 job-2
  local t0=$SECONDS i rc ok=1
  for i in 0 3; do
    if ! timeout 60 tail --pid="${APID[$i]}" -f /dev/null; then ok=0; echo "job-$i still running"; continue; fi
    wait "${APID[$i]}"; rc=$?
    [ $rc = 69 ] || { ok=0; echo "job-$i exited $rc"; }
  done
  [ $ok = 1 ] && grep -q "rendezvous timed out after 8 s .*need 3 node" "$T/D2.0.log" &&
    pass "D2: without a replacement both agents gave up with 69 after --rdzv-timeout ($((SECONDS - t0)) s)" ||
    { fail "D2: outcome"; dump D2; }
  RDZV_TIMEOUT=60
  cleanup_pods
}

[ -n "${SPARES_ONLY:-}" ] && { scenario_$SPARES_ONLY; echo "spares_test: $fails failure(s)"; exit $fails; }
scenario_a
if [ "$WORKER" != torch ]; then
  scenario_b
  scenario_c
  scenario_d
fi
if cat "$T"/*.log | grep -q "earlier attempt"; then fail "a worker saw an earlier attempt's keys"
else pass "no worker saw a key of an earlier attempt (--check-fresh-store)"; fi
agent_test_end spares_test
