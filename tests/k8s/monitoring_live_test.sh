#!/usr/bin/env bash
# k8s/monitoring against a real job: two real tdist-agents on loopback as the two pods of a job
# (2 workers each, the C training example training steadily), scraped every second by a real
# Prometheus (Debian's) with the labels the PodMonitor gives in a cluster (namespace, pod, job =
# <namespace>/<PodMonitor name>, container, endpoint). Phases: "steady" (two snapshots a few
# seconds apart), then "stalled" (global rank 3, node 1's local rank 1, stopped by SIGSTOP while
# the others wait for it in all_reduce). Then:
#   1. every query of the dashboard (each panel target, $namespace/$job/$__rate_interval
#      substituted) returns data from this Prometheus; an empty one fails naming the panel and the
#      series absent from the scrape (and the branch of issue 37 that adds it);
#   2. the series the rules read, per phase, are those of the committed recording
#      (monitoring_series.txt, which `promtool test rules` runs on): a series exported now and
#      not recorded, or recorded and no longer exported, fails: regenerate the recording.
# With --record OUT it writes the recording to OUT instead of step 2 (how monitoring_series.txt is
# made; see its header). About 30 s.
#   args: AGENT TRAIN MONITORING_PY K8S_BASE_KUSTOMIZATION SERIES [--record OUT]
set -euo pipefail

PY=/usr/bin/python3
PROM=/usr/bin/prometheus
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Only this shell's own jobs (agents, Prometheus); the agents' workers die with them
# (PR_SET_PDEATHSIG), a stopped one included once it gets SIGCONT.
cleanup() {
  local p
  [ -n "${STOPPED:-}" ] && kill -CONT "$STOPPED" 2>/dev/null
  for p in $(jobs -p); do kill -TERM "$p" 2>/dev/null || true; done
  for p in $(jobs -p); do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  [ -n "${T:-}" ] && [ -z "${TEST_TMPDIR:-}" ] && rm -rf "$T"
  return 0
}

# poll N CMD...: runs CMD every 0.2 s until it succeeds, at most N times.
poll() {
  local n="$1"
  shift
  for _ in $(seq "$n"); do "$@" && return 0; sleep 0.2; done
  return 1
}

promql() { curl -sf -G "http://127.0.0.1:$PP/api/v1/query" --data-urlencode "query=$1"; }
# has QUERY: the instant query returns at least one series.
has() { [[ "$(promql "$1" 2>/dev/null)" == *'"result":[{'* ]]; }
# stalled_on_metrics: an agent's /metrics has a tdist_rank_stalled sample at 1.
stalled_on_metrics() {
  local m
  m="$(curl -sf "http://127.0.0.1:$P0/metrics" "http://127.0.0.1:$P1/metrics")" || return 1
  grep -q '^tdist_rank_stalled{.*} 1$' <<<"$m"
}
now() { "$PY" -c 'import time; print(round(time.time() - float(open("'"$T/t0"'").read()), 3))'; }

start_job() {
  local mp n
  mp=$(free_port)
  export TDIST_STALL_REPORT_SECONDS=2
  for n in 0 1; do
    "$AGENT" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$mp" --nproc-per-node 2 \
      --run-id "mon-$$" --http-port 0 --http-port-file "$T/port$n" --log-dir "$T/logs$n" \
      --monitor-interval 0.1 -- "$TRAIN" --steps 1000000 --step-ms 20 --print-every 100000 \
      >"$T/agent$n.out" 2>"$T/agent$n.err" &
  done
  if ! { poll 100 test -s "$T/port1" && poll 100 test -s "$T/port0"; }; then
    fail "no HTTP ports: $(tail -3 "$T"/agent*.err)"
    return 1
  fi
  P0=$(cat "$T/port0") P1=$(cat "$T/port1")
}

start_prometheus() {
  PP=$(free_port)
  cat >"$T/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: default/tdist-train
    static_configs:
      - targets: ['127.0.0.1:$P0']
        labels: {namespace: default, pod: tdist-train-0, container: agent, endpoint: metrics, instance: '10.244.0.10:29600'}
      - targets: ['127.0.0.1:$P1']
        labels: {namespace: default, pod: tdist-train-1, container: agent, endpoint: metrics, instance: '10.244.1.10:29600'}
EOF
  "$PROM" --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
    --web.listen-address="127.0.0.1:$PP" --log.level=warn >"$T/prometheus.log" 2>&1 &
  # Both pods up, and every rank's collectives scraped more than twice (rates need two points).
  if poll 300 has 'count(up{job="default/tdist-train"} == 1) == 2' &&
    poll 300 has 'count(count_over_time(tdist_collective_ops_total{op="all_reduce"}[1m]) > 3) == 4'; then
    pass "Prometheus scrapes both agents; all 4 ranks' collectives in 3+ scrapes"
  else
    fail "Prometheus: targets or ranks missing: $(promql 'up' | head -c 400; tail -3 "$T/prometheus.log")"
    return 1
  fi
}

# stop_rank3: SIGSTOP global rank 3 (node 1), then wait for the stall to show: the agents' hang
# detector (tdist_rank_stalled) when this build has it, else node 0's /status naming rank 3 as
# holding the others (libtdist's collective ages) and a few more scrapes.
stop_rank3() {
  STOPPED=$(curl -sf "http://127.0.0.1:$P1/status" |
    "$PY" -c 'import json,sys; print([w["pid"] for w in json.load(sys.stdin)["workers"] if w["global_rank"] == 3][0])')
  kill -STOP "$STOPPED"
  if poll 150 stalled_on_metrics && poll 100 has 'tdist_rank_stalled == 1'; then
    pass "rank 3 stopped: tdist_rank_stalled names it"
  elif poll 100 sh -c "curl -sf http://127.0.0.1:$P0/status | grep -q 'hold'"; then
    sleep 3 # three more scrapes of the stalled job (not an assertion: the snapshot's spacing)
    pass "rank 3 stopped: node 0's /status names it holding the others (no tdist_rank_stalled series)"
  else
    fail "rank 3 stopped, but nothing names it: $(curl -sf "http://127.0.0.1:$P0/status" | head -c 400)"
  fi
}

main() {
  AGENT="$(realpath "$1")" TRAIN="$(realpath "$2")" MON="$(realpath "$3")" SERIES="$(realpath "$5")"
  local k8s record=""
  k8s="$(dirname "$(dirname "$(realpath "$4")")")"
  [ "${6:-}" = --record ] && record="$7"
  local tool
  for tool in "$PY" "$PROM" curl kubectl; do
    command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (Debian packages prometheus, curl; kubectl)"; exit 1; }
  done
  local lib="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
  [ -f "$lib/ports.sh" ] || lib="$(dirname "$(realpath "$0")")/../testlib"
  # shellcheck source=tests/testlib/ports.sh
  . "$lib/ports.sh" # free_port
  T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/mon.XXXXXX")"
  trap cleanup EXIT
  cp -rL "$k8s/monitoring" "$T/monitoring"
  kubectl kustomize "$T/monitoring" >"$T/monitoring.yaml"
  "$PY" "$MON" rules "$T/monitoring.yaml" "$T/rules.yml"
  mapfile -t names < <("$PY" "$MON" names "$T/rules.yml")

  start_job && start_prometheus || exit 1
  date +%s.%N >"$T/t0"
  "$PY" "$MON" snapshot "http://127.0.0.1:$PP" steady0 0 "${names[@]}" >"$T/rec"
  sleep 3 # the second snapshot's spacing: counters' rates come from the two
  "$PY" "$MON" snapshot "http://127.0.0.1:$PP" steady1 "$(now)" "${names[@]}" >>"$T/rec"
  stop_rank3
  "$PY" "$MON" snapshot "http://127.0.0.1:$PP" stalled "$(now)" "${names[@]}" >>"$T/rec"

  if "$PY" "$MON" query "http://127.0.0.1:$PP" "$T/monitoring.yaml" namespace=default \
    job=default/tdist-train __rate_interval=1m >"$T/query.out" 2>&1; then
    pass "dashboard: $(tail -1 "$T/query.out")"
  else
    fail "dashboard: $(tail -1 "$T/query.out"):"
  fi
  grep -v '^ok:' "$T/query.out" | sed '$d' || true

  if [ -n "$record" ]; then
    {
      sed -n '/^#/p;/^$/q' "$SERIES"
      echo
      cat "$T/rec"
    } >"$record"
    echo "recorded $(grep -vc '^[#@]' "$record") series in 3 phases to $record"
  elif "$PY" "$MON" compare "$SERIES" "$T/rec" >"$T/compare.out" 2>&1; then
    pass "$(cat "$T/compare.out")"
  else
    fail "the recording differs from this run's series:"
    cat "$T/compare.out"
  fi
  echo "monitoring_live_test: $fails failure(s)"
  [ "$fails" -eq 0 ]
}

main "$@"
