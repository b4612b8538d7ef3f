#!/usr/bin/env bash
# "See every rank" end to end: two real agents on loopback as two nodes (2 workers each) run
# stall_worker, whose global rank 3 (on node 1) sleeps before all_reduce #N while ranks 0..2 wait
# in it. Checked during the stall:
#   a. node 0's /status "collectives" names rank 3, and only rank 3, as holding the others up and
#      ranks 0,1,2 as stuck in all_reduce #N; /metrics on node 1 shows rank 3 idle (inflight 0,
#      current_seq 0, last_seq N-1) and rank 2 in #N, on node 0 ranks 0,1 in #N; promtool check
#      metrics passes on both agents; node 1's hang report names rank 3 "behind", rank 2 waiting;
#   c. a real Prometheus (web and TSDB on loopback / in TEST_TMPDIR) scraping both agents every
#      second answers PromQL over /api/v1/query with the 4 ranks and the stalled one apart;
#   b. SIGUSR1 to both agents: each logs the path of a JSON dump, and the union of the two dumps
#      alone names the missing rank (the one rank with no entry #N while every other has #N in
#      flight); the workers live on and the job completes (exit 0 on both nodes).
#   args: AGENT STALL_WORKER
set -uo pipefail
AGENT="$(realpath "$1")"; WORKER="$(realpath "$2")"
PY=/usr/bin/python3
PROM=/usr/bin/prometheus
T="${TEST_TMPDIR:-$(mktemp -d)}/obs.$$"
mkdir -p "$T"
STEPS=40 STALL_RANK=3 N=20 STALL_S=22
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
# Only this shell's own jobs that were never reaped: a waited-for pid may belong to someone else
# by now. The agents' workers die with them (PR_SET_PDEATHSIG).
cleanup() {
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
for tool in "$PY" "$PROM" promtool curl; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (Debian packages python3, prometheus, curl)"; exit 1; }
done
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/ports.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/ports.sh"   # free_port
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }

# ---- two nodes ----
MP=$(free_port)
export TDIST_STALL_REPORT_SECONDS=2 TDIST_LOG_LEVEL=info
for n in 0 1; do
  "$AGENT" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$MP" --nproc-per-node 2 \
    --run-id "obs-$$" --http-port 0 --http-port-file "$T/port$n" --log-dir "$T/logs$n" \
    --monitor-interval 0.05 -- "$WORKER" $STEPS $STALL_RANK $N $STALL_S >"$T/agent$n.out" 2>"$T/agent$n.err" &
  eval "apid$n=$!"
done
for _ in $(seq 200); do [ -s "$T/port0" ] && [ -s "$T/port1" ] && break; sleep 0.05; done
P0=$(cat "$T/port0" 2>/dev/null); P1=$(cat "$T/port1" 2>/dev/null)
[ -n "$P0" ] && [ -n "$P1" ] || { echo "FAIL: no HTTP ports ($(tail -3 "$T"/agent*.err))"; exit 1; }

# ---- a. /status on node 0 names rank 3 ----
summary=""
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$P0/status" >"$T/status0.json" 2>/dev/null &&
    summary=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1])).get("collectives") or "")' "$T/status0.json")
  case "$summary" in *stuck*hold*) break ;; esac
  sleep 0.1
done
echo "node 0 summary after $(elapsed) s: $summary"
if $PY - "$summary" $N <<'PYEOF'
import re, sys
s, n = sys.argv[1], int(sys.argv[2])
m = re.match(r"ranks? ([0-9,]+) stuck in all_reduce #(\d+) for [0-9.]+ s; ranks? ([0-9,]+) holds? them up \((.*)\)$", s)
assert m, s
stuck = sorted(int(x) for x in m.group(1).split(","))
holders = sorted(int(x) for x in m.group(3).split(","))
assert stuck == [0, 1, 2], stuck
assert int(m.group(2)) == n, m.group(2)
assert holders == [3], holders
assert m.group(4) == "3: not in a collective, last completed #%d" % (n - 1), m.group(4)
PYEOF
then pass "node 0 /status names rank 3 alone as holding ranks 0,1,2 up in all_reduce #$N"
else fail "node 0 /status collectives: '$summary'"; fi

curl -sf "http://127.0.0.1:$P1/status" >"$T/status1.json"
if $PY - "$T/status1.json" $N <<'PYEOF'
import json, sys
s, n = json.load(open(sys.argv[1])), int(sys.argv[2])
assert [w["global_rank"] for w in s["workers"]] == [2, 3], s["workers"]
r = {x["rank"]: x for x in s["ranks"]}
assert sorted(r) == [2, 3], s["ranks"]
assert r[3]["in_flight"] is None and r[3]["last_seq"] == n - 1, r[3]
f = r[2]["in_flight"]
assert f["op"] == "all_reduce" and f["seq"] == n and f["seconds"] > 1 and r[2]["last_seq"] == n - 1, r[2]
PYEOF
then pass "node 1 /status: rank 3 idle after #$((N - 1)), rank 2 in all_reduce #$N"
else fail "node 1 /status: $(cat "$T/status1.json")"; fi

# node 1's hang detector: rank 3 is behind the collective its local peer waits in (the stats
# files are read once a second: up to 10 s)
hang=""
for _ in $(seq 50); do
  hang=$(curl -sf "http://127.0.0.1:$P1/status" | $PY -c '
import json, sys
h = json.load(sys.stdin)["hang"]
if h: print(h["rank"], h["reason"], *sorted((r["rank"], r["role"]) for r in h["ranks"]))')
  [ -n "$hang" ] && break
  sleep 0.2
done
if [ "$hang" = "3 behind (2, 'waiting') (3, 'holding')" ] &&
  grep -q '^tdist_rank_stalled{rank="3",local_rank="1",reason="behind"} 1$' \
    <<<"$(curl -sf "http://127.0.0.1:$P1/metrics")"; then
  pass "node 1 hang report: rank 3 behind, rank 2 waiting on it"
else fail "node 1 hang report: '$hang'"; fi

cat >"$T/metrics_check.py" <<'PYEOF'
# metrics_check.py FILE N RANK:WANT... (WANT: idle | wait): the per-rank series of one agent.
import re, sys
text, n = open(sys.argv[1]).read(), int(sys.argv[2])
series = {}
for line in text.splitlines():
    if not line or line.startswith("#"):
        continue
    m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$', line)
    assert m, line
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
    series.setdefault(m.group(1), []).append((labels, float(m.group(3))))
def one(name, rank, **more):
    got = [v for l, v in series.get(name, []) if l.get("rank") == str(rank) and all(l.get(k) == w for k, w in more.items())]
    assert len(got) == 1, (name, rank, more, got)
    return got[0]
for arg in sys.argv[3:]:
    rank, want = arg.split(":")
    infl, cur, last = one("tdist_rank_inflight_seconds", rank), one("tdist_rank_current_seq", rank), one("tdist_rank_last_seq", rank)
    assert last == n - 1, (rank, "last_seq", last)
    if want == "idle":
        assert infl == 0 and cur == 0, (rank, infl, cur)
    else:
        assert infl > 1 and cur == n, (rank, infl, cur)
    assert one("tdist_collective_ops_total", rank, op="all_reduce") == n - 1, rank
    assert one("tdist_collective_bytes_total", rank, op="all_reduce") == 4 * (n - 1), rank
    assert one("tdist_collective_errors_total", rank, op="all_reduce") == 0, rank
    assert one("tdist_collective_duration_seconds_count", rank, op="all_reduce") == n - 1, rank
    assert one("tdist_collective_duration_seconds_bucket", rank, op="all_reduce", le="+Inf") == n - 1, rank
print("ok")
PYEOF
for n in 0 1; do
  port=$([ $n = 0 ] && echo "$P0" || echo "$P1")
  curl -sf "http://127.0.0.1:$port/metrics" >"$T/metrics$n"
  promtool check metrics <"$T/metrics$n" >"$T/promtool$n" 2>&1 && pass "promtool check metrics on node $n" ||
    fail "promtool on node $n: $(cat "$T/promtool$n")"
done
$PY "$T/metrics_check.py" "$T/metrics1" $N 2:wait 3:idle >"$T/mc1" 2>&1 &&
  pass "node 1 /metrics: rank 3 inflight 0, current_seq 0, last_seq $((N - 1)); rank 2 waiting in #$N" ||
  fail "node 1 /metrics: $(cat "$T/mc1")"
$PY "$T/metrics_check.py" "$T/metrics0" $N 0:wait 1:wait >"$T/mc0" 2>&1 &&
  pass "node 0 /metrics: ranks 0,1 waiting in #$N" || fail "node 0 /metrics: $(cat "$T/mc0")"

# ---- c. Prometheus scraping both agents ----
PP=$(free_port)
cat >"$T/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tdist
    static_configs:
      - targets: ['127.0.0.1:$P0', '127.0.0.1:$P1']
EOF
"$PROM" --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
  --web.listen-address="127.0.0.1:$PP" --log.level=warn >"$T/prometheus.log" 2>&1 &
prom=$!
up=0
for _ in $(seq 300); do
  if curl -sf "http://127.0.0.1:$PP/api/v1/targets" >"$T/targets.json" 2>/dev/null &&
     $PY -c '
import json, sys
t = json.load(open(sys.argv[1]))["data"]["activeTargets"]
sys.exit(0 if len(t) == 2 and all(x["health"] == "up" for x in t) else 1)' "$T/targets.json"; then
    up=1; break
  fi
  sleep 0.1
done
[ $up = 1 ] && pass "Prometheus: both agents up after $(elapsed) s" || fail "Prometheus targets: $(cat "$T/targets.json" 2>/dev/null; tail -5 "$T/prometheus.log")"
promql() { curl -sf -G "http://127.0.0.1:$PP/api/v1/query" --data-urlencode "query=$1"; }
cat >"$T/promql_check.py" <<'PYEOF'
# promql_check.py KIND N < answer: the per-rank vector of one PromQL instant query.
import json, sys
kind, n = sys.argv[1], int(sys.argv[2])
d = json.load(sys.stdin)
assert d["status"] == "success", d
v = {int(r["metric"]["rank"]): float(r["value"][1]) for r in d["data"]["result"]}
if kind == "inflight":
    assert sorted(v) == [0, 1, 2, 3], v
    assert v[3] == 0 and all(v[r] > 1 for r in (0, 1, 2)), v
elif kind == "last_seq":
    assert v == {0: n - 1, 1: n - 1, 2: n - 1, 3: n - 1}, v
elif kind == "behind":
    assert v == {3: 0}, v
print(v)
PYEOF
ok=0
for _ in $(seq 50); do  # the first scrapes may not hold every series yet
  promql 'max by (rank) (tdist_rank_inflight_seconds)' >"$T/q1.json" &&
    $PY "$T/promql_check.py" inflight $N <"$T/q1.json" >"$T/q1.out" 2>&1 &&
    promql 'tdist_rank_last_seq' >"$T/q2.json" &&
    $PY "$T/promql_check.py" last_seq $N <"$T/q2.json" >"$T/q2.out" 2>&1 &&
    promql 'tdist_rank_current_seq < scalar(max(tdist_rank_current_seq))' >"$T/q3.json" &&
    $PY "$T/promql_check.py" behind $N <"$T/q3.json" >"$T/q3.out" 2>&1 && { ok=1; break; }
  sleep 0.2
done
if [ $ok = 1 ]; then
  pass "PromQL max by (rank) (tdist_rank_inflight_seconds): $(cat "$T/q1.out")"
  pass "PromQL tdist_rank_last_seq: $(cat "$T/q2.out")"
  pass "PromQL current_seq below the job's maximum names rank 3 alone: $(cat "$T/q3.out")"
else
  fail "PromQL after $(elapsed) s: $(cat "$T"/q*.out 2>/dev/null) $(head -c 600 "$T"/q*.json 2>/dev/null)"
fi
kill -TERM $prom; wait $prom; rc=$?
[ $rc = 0 ] && pass "Prometheus stopped cleanly" || fail "Prometheus exit $rc: $(tail -3 "$T/prometheus.log")"

# ---- b. SIGUSR1: a dump per node; their union names the missing rank ----
kill -USR1 "$apid0" "$apid1"
dumps=()
for n in 0 1; do
  path=""
  for _ in $(seq 100); do
    path=$(sed -n 's/.*flight recorders of this node.s ranks (SIGUSR1) written to \(.*\)$/\1/p' "$T/agent$n.err" | head -1)
    [ -n "$path" ] && break
    sleep 0.05
  done
  if [ -n "$path" ] && [ -s "$path" ]; then
    case "$path" in "$T/logs$n/"*) pass "node $n logged its dump: $path" ;;
      *) fail "node $n dump outside its --log-dir: $path" ;; esac
    dumps+=("$path")
  else
    fail "node $n: no dump path logged after SIGUSR1 ($(tail -3 "$T/agent$n.err"))"
  fi
done
if [ ${#dumps[@]} = 2 ] && $PY - $N "${dumps[@]}" >"$T/dump.out" 2>&1 <<'PYEOF'
import json, sys
n, files = int(sys.argv[1]), sys.argv[2:]
ranks = {}
for f in files:
    d = json.load(open(f))
    for r in d["ranks"]:
        assert r["rank"] not in ranks, ("rank in two dumps", r["rank"])
        ranks[r["rank"]] = r
assert sorted(ranks) == [0, 1, 2, 3], sorted(ranks)
# The analysis: the rank whose flight recorder has no entry #n while every other rank has #n in
# flight is the one holding the job up.
def entry(r, seq):
    return [e for e in ranks[r]["flight"] if e["seq"] == seq and e["group"] == 0]
waiting = [r for r in ranks if any(e["status"] == "in_flight" and e["op"] == "all_reduce" for e in entry(r, n))]
missing = [r for r in ranks if not entry(r, n)]
assert sorted(waiting) == [0, 1, 2] and missing == [3], (waiting, missing)
assert all(e["status"] == "TDIST_OK" for r in ranks for e in entry(r, n - 1)), "#n-1 finished everywhere"
print("the dumps name rank %d: no all_reduce #%d while ranks %s wait in it" % (missing[0], n, sorted(waiting)))
PYEOF
then pass "$(cat "$T/dump.out")"; else fail "dump analysis: $(cat "$T/dump.out")"; fi

# The dump must not cost the job: SIGUSR1's default action kills a worker that does not handle it
# (stall_worker, an unmodified PyTorch script), so the agent must not pass it on.
for n in 0 1; do
  eval "p=\$apid$n"
  left=$((STALL_S + 30 - $(elapsed)))
  for _ in $(seq $((left > 0 ? left * 10 : 1))); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && { fail "node $n: still running $STALL_S s after the stall began"; kill -TERM "$p"; }
  wait "$p"; rc=$?
  [ $rc = 0 ] && pass "node $n: job completed after the stall and SIGUSR1 (exit 0)" ||
    fail "node $n: exit $rc after SIGUSR1: $(grep -E ' E |giving up' "$T/agent$n.err" | head -2)"
done
grep -q "killed by signal" "$T"/agent*.err && fail "a worker was killed: $(grep -h 'killed by signal' "$T"/agent*.err | head -1)"

echo "observability_test: $fails failure(s) in $(elapsed) s"
[ $fails -eq 0 ]
