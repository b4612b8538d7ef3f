#!/usr/bin/env bash
# Three "pods" (network namespaces with their own IPs, hostnames job-0..2, names served by dnsmasq
# like a headless Service with publishNotReadyAddresses), each running tdist-agent with an
# unmodified PyTorch DDP (gloo) script (the PyTorch of $TDIST_TORCH, tests/testlib/torch.sh) or,
# with TDIST_MULTIPOD_WORKER=c, the C training example; discovered the Kubernetes way: node rank
# from JOB_COMPLETION_INDEX, the store host by the DNS name job-0.svc.ns.svc.cluster.local.
#   A. kill pod job-1 mid-training (agent and workers), start a replacement with a NEW IP: the
#      job restarts and completes on every node.
#   B. the same with pod job-0, the store host: the others re-resolve, reach the new store and the
#      job completes.
#   C. a worker crashes mid-training (random node and step) on attempts 0 and 1: two restarts of
#      the whole job, which completes on attempt 2.
# Every worker checks attempt isolation before it joins (--check-fresh-store: its store holds no
# rank start of an earlier attempt, also after the store host was replaced).
#   args: AGENT DDP_SCRIPT PODS_SH TRAIN_BIN
set -uo pipefail
AGENT="$(realpath "$1")"; DDP="$(realpath "$2")"; PODS_SH="$(realpath "$3")"; TRAIN="$(realpath "$4")"
WORKER="${TDIST_MULTIPOD_WORKER:-torch}"
T="${TEST_TMPDIR:-$(mktemp -d)}/multipod.$$"; mkdir -p "$T"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
SEED="${TDIST_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}"
echo "multipod_test: $WORKER workers, seed $SEED (TDIST_TEST_SEED=$SEED replays)"
if [ "$WORKER" = torch ]; then
  . "$LIB/torch.sh"   # PY, TDIST_PYTHON
  job=("$DDP" --steps 400 --step-sleep 0.02 --check-fresh-store --seed "$SEED")
  started="step  20"
else
  PY=/usr/bin/python3
  # 400 steps of 20 ms as the PyTorch job: the C steps alone take microseconds, and the job must
  # still be training when a scenario kills a pod.
  job=("$TRAIN" --steps 400 --step-ms 20 --print-every 20 --check-fresh-store --seed "$SEED")
  started="step     20"
fi
# shellcheck source=pods/pods.sh
source "$PODS_SH"
pods_init job svc ns cluster.local || exit 1
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod

# start_agent INDEX LOGNAME [JOB ARGS...]: (re)creates pod job-INDEX and runs the agent in it.
start_agent() {
  local i=$1 log=$2 ip
  shift 2
  ip=$(pods_start "job-$i") || return 1
  echo "pod job-$i is $ip ($log)"
  pods_exec "job-$i" JOB_COMPLETION_INDEX="$i" POD_NAMESPACE=ns -- \
    "$AGENT" --nnodes 3 --nproc-per-node 1 --max-restarts 3 --service svc --master-port 29500 \
      --heartbeat-interval 0.5 --heartbeat-timeout 4 --rdzv-timeout 120 --stop-grace-period 3 \
      --monitor-interval 0.1 --http-port 29600 \
      -- "${job[@]}" "$@" >"$T/$log.log" 2>&1
  agent_in_pod "$i"
}

# finish: waits for the three agents; all must exit 0.
finish() {
  local i rc ok=1
  for i in 0 1 2; do
    wait "${APID[$i]}"; rc=$?
    [ $rc -eq 0 ] || { ok=0; echo "agent job-$i exited $rc"; }
  done
  [ $ok = 1 ]
}

scenario() {
  local name=$1 victim=$2
  for i in 0 1 2; do start_agent $i "$name.$i" || { fail "$name: pod start"; return; }; done
  if ! pods_wait_for "$T/$name.0.log" "$started" 90; then
    fail "$name: training did not start"; tail -20 "$T/$name".*.log; return
  fi
  # The agent on job-1 serves /metrics and /status on the pod IP (probes use the pod IP).
  local st
  st=$(PODS_FG_TIMEOUT=10 pods_exec_fg job-2 -- curl -s "http://job-1.svc:29600/status")
  echo "$st" | $PY -c 'import json,sys; s=json.load(sys.stdin); assert s["state"]=="running" and s["group_world_size"]==3 and len(s["members"])==3, s' &&
    pass "$name: /status of job-1 reached by name from job-2" || fail "$name: /status: $st"
  echo "killing pod job-$victim"
  pods_kill "job-$victim" KILL
  wait "${APID[$victim]}" 2>/dev/null
  sleep 0.5
  start_agent "$victim" "$name.$victim.new" || { fail "$name: restart pod"; return; }
  if finish; then pass "$name: all agents exited 0 after pod job-$victim was replaced"
  else fail "$name: agents failed"; for f in "$T/$name".*.log; do echo "== $f"; grep -v '^step' "$f" | tail -25; done; fi
  local zero="$T/$name.0.log"; [ "$victim" = 0 ] && zero="$T/$name.0.new.log"
  check_final "$name" "$zero" "[1-9]"
  for i in 0 1 2; do pods_kill "job-$i" KILL >/dev/null 2>&1; done
}

# check_final NAME LOG ATTEMPT_RE: node 0's last lines say the job trained to the end.
check_final() {
  if [ "$WORKER" = torch ]; then
    grep -q "params identical: True" "$2" && grep -qE "done: world 3 attempt $3 " "$2"
  else
    grep -qE "train: OK: .*bitwise identical on all 3 ranks \(attempt $3\)" "$2"
  fi && pass "$1: training completed on attempt $3 with identical parameters" ||
    fail "$1: no final line (attempt $3) in $2: $(tail -3 "$2")"
}

# C: crashes of a worker mid-training, no pod lost.
scenario_crash() {
  local i
  for i in 0 1 2; do start_agent $i "C.$i" --crash-until-attempt 2 || { fail "C: pod start"; return; }; done
  if finish; then pass "C: all agents exited 0 after 2 crashes mid-training"
  else fail "C: agents failed"; for f in "$T"/C.*.log; do echo "== $f"; grep -v '^step' "$f" | tail -25; done; fi
  local n
  n=$(cat "$T"/C.*.log | grep -c "crashing at step")
  [ "$n" = 2 ] && pass "C: two crashes, on attempts 0 and 1" || fail "C: $n crash lines"
  [ "$(grep -c 'restarting the workers' "$T/C.0.log")" = 2 ] && pass "C: node 0 restarted twice" ||
    fail "C: node 0 restarts: $(grep -c 'restarting the workers' "$T/C.0.log")"
  check_final C "$T/C.0.log" 2
  for i in 0 1 2; do pods_kill "job-$i" KILL >/dev/null 2>&1; done
}

scenario A 1
scenario B 0
scenario_crash
grep -h "round .* ended\|lost the store\|restarting" "$T"/B.*.log | head -8
if cat "$T"/*.log | grep -q "earlier attempt"; then fail "a worker saw an earlier attempt's keys"
else pass "no worker saw a key of an earlier attempt (--check-fresh-store)"; fi
agent_test_end multipod_test
