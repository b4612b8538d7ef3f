#!/usr/bin/env bash
# Three "pods" (network namespaces with their own IPs, hostnames job-0..2, names served by dnsmasq
# like a headless Service with publishNotReadyAddresses), each running tdist-agent with an
# unmodified PyTorch DDP (gloo) script, discovered the Kubernetes way: node rank from
# JOB_COMPLETION_INDEX, the store host by the DNS name job-0.svc.ns.svc.cluster.local.
#   A. kill pod job-1 mid-training (agent and workers), start a replacement with a NEW IP: the
#      job restarts and completes on every node.
#   B. the same with pod job-0, the store host: the others re-resolve, reach the new store and the
#      job completes.
#   args: AGENT DDP_SCRIPT PODS_SH
set -uo pipefail
AGENT="$(realpath "$1")"; DDP="$(realpath "$2")"; PODS_SH="$(realpath "$3")"
PY=/usr/bin/python3
T="${TEST_TMPDIR:-$(mktemp -d)}/multipod.$$"; mkdir -p "$T"
# shellcheck source=pods/pods.sh
source "$PODS_SH"
pods_init job svc ns cluster.local || exit 1
export TDIST_PYTHON=$PY
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
declare -A APID

# start_agent INDEX LOGNAME: (re)creates pod job-INDEX and runs the agent in it.
start_agent() {
  local i=$1 log=$2 ip
  ip=$(pods_start "job-$i") || return 1
  echo "pod job-$i is $ip ($log)"
  pods_exec "job-$i" JOB_COMPLETION_INDEX="$i" POD_NAMESPACE=ns -- \
    "$AGENT" --nnodes 3 --nproc-per-node 1 --max-restarts 3 --service svc --master-port 29500 \
      --heartbeat-interval 0.5 --heartbeat-timeout 4 --rdzv-timeout 120 --stop-grace-period 3 \
      --monitor-interval 0.1 --http-port 29600 \
      -- "$DDP" --steps 400 --step-sleep 0.02 >"$T/$log.log" 2>&1
  APID[$i]=$PODS_PID
}

# wait_for FILE PATTERN SECONDS
wait_for() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
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
  if ! wait_for "$T/$name.0.log" "step  20" 90; then
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
  grep -q "params identical: True" "$zero" && grep -qE "done: world 3 attempt [1-9]" "$zero" &&
    pass "$name: training completed on a later attempt with identical parameters" ||
    fail "$name: no final line in $zero: $(tail -3 "$zero")"
  for i in 0 1 2; do pods_kill "job-$i" KILL >/dev/null 2>&1; done
}

scenario A 1
scenario B 0
grep -h "round .* ended\|lost the store\|restarting" "$T"/B.*.log | head -8
echo "multipod_test: $fails failure(s)"
[ $fails -eq 0 ]
