#!/usr/bin/env bash
# Hostile rendezvous records (issue 14, item 1): a standalone tdist-agent with a real store and a
# sleeping worker, and the real tdist-store CLI writing records no agent of the job writes. Checks
# the agent stays bounded (CPU from /proc/<pid>/stat, log growth), honours SIGTERM within the grace
# period, keeps /healthz answering, names the key and the value, never wraps the round, and counts
# every restart a forged record causes against --max-restarts.
#   args: AGENT TDIST_STORE
set -uo pipefail
AGENT="$(realpath "$1")"; STORE="$(realpath "$2")"
T="${TEST_TMPDIR:-$(mktemp -d)}/hostile.$$"
mkdir -p "$T"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
trap agent_kill_all EXIT
export TDIST_LOG_LEVEL=info
HZ=$(getconf CLK_TCK)

# start NAME MAX_RESTARTS: an agent in the background; sets APID (the pid started: the agent's
# guard), AG (the agent proper, the workers' parent: its CPU is the one measured), HPORT, SPORT,
# RUN, LOG.
start() {
  LOG="$T/$1.err"
  rm -f "$T/$1.port"
  "$AGENT" --standalone --nproc-per-node 1 --monitor-interval 0.05 --stop-grace-period 3 \
    --max-restarts "$2" --rdzv-timeout 60 --http-port 0 --http-port-file "$T/$1.port" \
    -- /bin/sleep 600 >"$T/$1.out" 2>"$LOG" &
  agent_started $!
  for _ in $(seq 200); do
    [ -s "$T/$1.port" ] && grep -q "started 1 worker" "$LOG" && break
    sleep 0.05
  done
  HPORT=$(cat "$T/$1.port" 2>/dev/null)
  AG=$(pgrep -P "$APID" -x tdist-agent || echo "$APID")
  local js
  js=$(curl -s --max-time 5 "http://127.0.0.1:$HPORT/status")
  SPORT=$(echo "$js" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["master_port"])')
  RUN=$(echo "$js" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')
}
st() { "$STORE" "$1" "tdist/$RUN/$2" "${@:3}" --port "$SPORT" --timeout-ms 5000; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# wait_log PATTERN SECS: 0 once the agent's log matches.
wait_log() {
  for _ in $(seq $(($2 * 20))); do grep -q -- "$1" "$LOG" && return 0; sleep 0.05; done
  return 1
}
# stop_agent: SIGTERM; 0 if it exited 143 within the grace period (3 s) plus 3 s of slack.
stop_agent() {
  kill -TERM "$APID"
  for _ in $(seq 120); do kill -0 "$APID" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$APID" 2>/dev/null; then return 1; fi
  wait "$APID"
  [ $? -eq 143 ]
}

# 1. round = garbage: bounded CPU and log, SIGTERM honoured, /healthz up, the key named.
start garbage 3
if [ -z "$RUN" ]; then fail "agent did not start: $(tail -5 "$LOG")"; else
  st set round garbage
  wait_log "protocol error: key round holds 'garbage'" 10 && pass "garbage round: key and value named" ||
    fail "garbage round: no protocol error naming the key ($(tail -3 "$LOG"))"
  sleep 1
  t0=$(ticks "$AG"); s0=$(stat -c %s "$LOG")
  sleep 4
  t1=$(ticks "$AG"); s1=$(stat -c %s "$LOG")
  cpu=$(((t1 - t0) * 1000 / HZ))
  grow=$((s1 - s0))
  echo "garbage round: agent CPU ${cpu} ms and log +${grow} B over 4 s"
  [ "$cpu" -lt 1000 ] && pass "garbage round: CPU bounded (${cpu} ms in 4 s)" ||
    fail "garbage round: agent CPU ${cpu} ms in 4 s"
  [ "$grow" -lt 16384 ] && pass "garbage round: log bounded (+${grow} B in 4 s)" ||
    fail "garbage round: log grew ${grow} B in 4 s"
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$HPORT/healthz")
  [ "$code" = 200 ] && pass "garbage round: /healthz 200 (the loop still turns)" ||
    fail "garbage round: /healthz $code"
  grep -q "store host went away" "$LOG" && fail "garbage round: reported as the store going away" ||
    pass "garbage round: not reported as a lost store"
  stop_agent && pass "garbage round: SIGTERM honoured within the grace period" ||
    fail "garbage round: SIGTERM not honoured within 6 s"
fi

# 2. round = INT64_MAX, then a worker failure: a clear error, no wrap to INT64_MIN.
start int64max 3
if [ -n "$RUN" ]; then
  st set round 9223372036854775807
  pkill -KILL -P "$AG" sleep
  wait_log "holds '9223372036854775807'" 10 && pass "INT64_MAX round: rejected, value named" ||
    fail "INT64_MAX round: no clear error ($(tail -3 "$LOG"))"
  # A worker of a round INT64_MAX (if the agent started one) fails too: round + 1 must not wrap.
  sleep 1
  pkill -KILL -P "$AG" sleep
  sleep 2
  grep -q -- "-9223372036854775808" "$LOG" && fail "INT64_MAX round: wrapped" ||
    pass "INT64_MAX round: no wrap"
  stop_agent && pass "INT64_MAX round: SIGTERM honoured" || fail "INT64_MAX round: SIGTERM"
fi

# 3. a bumped round (no /end), twice with --max-restarts 1: one counted restart, then the job
#    fails (exit 70): forged rounds cost restarts, never an endless loop.
start bumped 1
if [ -n "$RUN" ]; then
  st set round 1
  wait_log "key round moved from 0 to 1 with no 0/end record" 10 &&
    pass "bumped round: the restart says what moved" || fail "bumped round: ($(tail -3 "$LOG"))"
  wait_log "1 of 1 restarts used" 10 && pass "bumped round: counted" || fail "bumped round: not counted"
  wait_log "started 1 worker" 10
  sleep 0.5
  st set round 2
  for _ in $(seq 200); do kill -0 "$APID" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$APID" 2>/dev/null && kill -KILL "$APID" # still restarting: fails below
  wait "$APID"; rc=$?
  [ $rc -eq 70 ] && pass "bumped round twice: gave up after --max-restarts 1 (exit 70)" ||
    fail "bumped round twice: exit $rc ($(tail -3 "$LOG"))"
fi

# 4. a fake /end alone restarts nothing; with a bumped round its unverifiable 'membership' reason
#    is a protocol error that counts.
start fakeend 3
if [ -n "$RUN" ]; then
  st set 0/end "membership scaling up, trust me"
  sleep 1.5
  grep -q "round 0 ended" "$LOG" && fail "fake /end alone restarted the workers" ||
    pass "fake /end alone: no restart"
  st set round 1
  wait_log "key 0/end says 'membership scaling up, trust me' but no node is waiting" 10 &&
    pass "fake /end + bumped round: protocol error, named" || fail "fake /end: ($(tail -3 "$LOG"))"
  wait_log "1 of 3 restarts used" 10 && pass "fake /end: counted" || fail "fake /end: not counted"
  stop_agent || fail "fake /end: SIGTERM"
fi

# 5. a fake "node replaced" record (a joiner with node rank 0): the restart names the record's
#    address and counts; a malformed joiner record is a protocol error; a fake joiner without a
#    record changes nothing and is not a lost store.
start replaced 3
if [ -n "$RUN" ]; then
  st add 0/joined 1 >/dev/null
  sleep 1.5
  grep -q "round 0 ended\|store_lost\|lost the store" "$LOG" &&
    fail "fake joiner without a record: $(grep -m1 "ended\|lost" "$LOG")" ||
    pass "fake joiner without a record: ignored"
  st set 0/node/2 "0 1 0 0 10.66.6.6 evil 0"
  wait_log "node 0 rejoined from 10.66.6.6" 10 && pass "fake replaced node: named in the log" ||
    fail "fake replaced node: ($(tail -3 "$LOG"))"
  wait_log "1 of 3 restarts used" 10 && pass "fake replaced node: counted" ||
    fail "fake replaced node: not counted"
  wait_log "started 1 worker(s): global ranks 0..0 of 1" 10
  sleep 0.5
  r=$(curl -s --max-time 5 "http://127.0.0.1:$HPORT/status" |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["round"])')
  st add "$r/joined" 1 >/dev/null
  st set "$r/node/2" "junk"
  wait_log "protocol error: key $r/node/2 holds 'junk'" 10 &&
    pass "malformed joiner record: protocol error naming the key" ||
    fail "malformed joiner record: ($(tail -3 "$LOG"))"
  stop_agent || fail "replaced: SIGTERM"
fi

agent_test_end hostile_rdzv_test
