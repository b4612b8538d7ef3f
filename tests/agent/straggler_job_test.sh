#!/usr/bin/env bash
# Stragglers named (issue 37, item 3): two real agents on loopback as two nodes, 2 ranks each, run
# straggle_worker (one all_reduce per step, every rank sleeps 1 ms per step):
#   a. global rank 2 (node 1) sleeps 5 ms more per step: node 0's /status names it the straggler
#      within a few tens of analysed collectives ("named_after" <= 100; 16 usually), it caused
#      the most wait, /metrics says tdist_straggler_rank 2 with a wait-caused counter per rank
#      (promtool check metrics), node 1 shows no straggler section (node 0 computes it);
#   b. no rank slowed: after 300 analysed collectives, none was ever named.
# Each job is stopped with SIGTERM once checked. Takes about 15 s.
#   args: AGENT STRAGGLE_WORKER
set -uo pipefail
AGENT="$(realpath "$1")"; WORKER="$(realpath "$2")"
PY=/usr/bin/python3
T="${TEST_TMPDIR:-$(mktemp -d)}/strag.$$"
mkdir -p "$T"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/ports.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/ports.sh" # free_port
# Only this shell's own jobs; the agents' workers die with them (PR_SET_PDEATHSIG).
cleanup() {
  local p
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
for tool in "$PY" promtool curl; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found"; exit 1; }
done
export TDIST_LOG_LEVEL=info

# start_job NAME SLOW_RANK: two agents, 2 ranks each; sets P0, P1 (HTTP ports), apid0, apid1.
start_job() {
  local n mp
  mp=$(free_port)
  for n in 0 1; do
    "$AGENT" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$mp" \
      --nproc-per-node 2 --run-id "strag-$1-$$" --http-port 0 --http-port-file "$T/$1.port$n" \
      --log-dir "$T" -- "$WORKER" 20000 1000 "$2" 5000 >"$T/$1.out$n" 2>"$T/$1.err$n" &
    eval "apid$n=$!"
  done
  for _ in $(seq 200); do [ -s "$T/$1.port0" ] && [ -s "$T/$1.port1" ] && break; sleep 0.05; done
  P0=$(cat "$T/$1.port0" 2>/dev/null); P1=$(cat "$T/$1.port1" 2>/dev/null)
  [ -n "$P0" ] && [ -n "$P1" ]
}

# stop_job: SIGTERM both agents, wait up to 30 s each.
stop_job() {
  local p
  # shellcheck disable=SC2154 # set by start_job's eval
  for p in "$apid0" "$apid1"; do kill -TERM "$p" 2>/dev/null; done
  for p in "$apid0" "$apid1"; do
    for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && { fail "agent $p still running 30 s after SIGTERM"; kill -KILL "$p"; }
    wait "$p" 2>/dev/null
  done
}

# poll_status NAME PY_CONDITION: node 0's /status into $T/NAME.status until the Python condition
# on s (the JSON) holds, for at most 60 s; every answer is appended to $T/NAME.seen (one line
# each). 0 when it held.
poll_status() {
  local end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ]; do
    if curl -sf --max-time 5 "http://127.0.0.1:$P0/status" >"$T/$1.status" 2>/dev/null; then
      $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); print(json.dumps(s.get("stragglers")))' \
        "$T/$1.status" >>"$T/$1.seen"
      $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); g=s.get("stragglers"); sys.exit(0 if ('"$2"') else 1)' \
        "$T/$1.status" && return 0
    fi
    sleep 0.1
  done
  return 1
}

# ---- a. rank 2 slowed by 5 ms per step ----
if start_job a 2 && poll_status a 'g and g["straggler"] is not None'; then
  if $PY - "$T/a.status" <<'PYEOF'
import json, sys
g = json.load(open(sys.argv[1]))["stragglers"]
print("stragglers:", json.dumps(g))
assert g["straggler"] == 2, g
# Named within a few tens of analysed collectives: 16 (the least the rule looks at) is usual; up
# to 64 seen with 4 copies of this test at once on 2 cores (noisy first collectives).
assert g["named_after"] <= 100, "named after %d analysed collectives" % g["named_after"]
w = g["wait_caused_seconds"]
assert len(w) == 4 and w[2] == max(w) and w[2] > 0, w
assert g["held"] >= 0.3, g  # at least the lower threshold, which keeps it named
PYEOF
  then pass "a. node 0 names rank 2 the straggler after $($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["stragglers"]["named_after"])' "$T/a.status") analysed collectives"
  else fail "a. /status stragglers: $(tail -1 "$T/a.seen")"; fi
  curl -sf "http://127.0.0.1:$P0/metrics" >"$T/a.metrics0"
  grep -q '^tdist_straggler_rank 2$' "$T/a.metrics0" &&
    [ "$(grep -c '^tdist_rank_wait_caused_seconds_total{rank="[0-3]"} ' "$T/a.metrics0")" = 4 ] &&
    pass "a. /metrics: tdist_straggler_rank 2, a wait-caused counter for each of the 4 ranks" ||
    fail "a. /metrics: $(grep -E 'straggler|wait_caused' "$T/a.metrics0")"
  promtool check metrics <"$T/a.metrics0" >"$T/a.promtool" 2>&1 &&
    pass "a. promtool check metrics passes on node 0" || fail "a. promtool: $(cat "$T/a.promtool")"
  curl -sf "http://127.0.0.1:$P1/status" >"$T/a.status1"
  curl -sf "http://127.0.0.1:$P1/metrics" >"$T/a.metrics1"
  $PY -c 'import json,sys; assert json.load(open(sys.argv[1]))["stragglers"] is None' "$T/a.status1" &&
    ! grep -q 'straggler\|wait_caused' "$T/a.metrics1" &&
    pass "a. node 1: stragglers null, no straggler series" || fail "a. node 1 has a straggler section"
  grep -q "straggler: rank 2: " "$T/a.err0" && pass "a. node 0 logs it: $(grep -o 'straggler: rank 2: .*' "$T/a.err0" | head -1)" ||
    fail "a. node 0 did not log the straggler"
else
  fail "a. no straggler named within 60 s: $(tail -1 "$T/a.seen" 2>/dev/null; tail -3 "$T/a.err0")"
fi
stop_job

# ---- b. nobody slowed ----
if start_job b -1 && poll_status b 'g and g["collectives_analysed"] >= 300'; then
  if $PY - "$T/b.seen" <<'PYEOF'
import json, sys
seen = [json.loads(l) for l in open(sys.argv[1]) if l.strip() != "null"]
named = [g for g in seen if g["straggler"] is not None]
last = seen[-1]
print("after %d collectives: leader %s, share %.2f, held %.2f, mean wait %.3f ms" % (
    last["collectives_analysed"], last["leader"], last["share"], last["held"],
    last["mean_wait_seconds"] * 1e3))
assert not named, "named: %s" % json.dumps(named[0])
PYEOF
  then pass "b. no rank slowed: none named over 300 collectives"
  else fail "b. a straggler was named with no rank slowed"; fi
else
  fail "b. fewer than 300 collectives analysed within 60 s: $(tail -1 "$T/b.seen" 2>/dev/null; tail -3 "$T/b.err0")"
fi
stop_job

agent_test_end straggler_job_test
