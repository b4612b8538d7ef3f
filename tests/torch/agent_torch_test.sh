#!/usr/bin/env bash
# A PyTorch job on the "tdist" backend under tdist-agent, installed as the image installs it
# (PREFIX/bin/tdist-agent, PREFIX/lib/libtdist.so, PREFIX/python/tdist_torch), with no
# PYTHONPATH or TDIST_LIBRARY of our own: the agent puts the package on the workers' import path
# and the package finds the library and its C++ group beside it. 3 workers run stall_train.py; rank 2 sleeps
# before all_reduce #20 while ranks 0 and 1 wait in it. Checked during the stall:
#   - /status "collectives" names rank 2 alone as holding ranks 0,1 up in all_reduce #20;
#   - /metrics has tdist_collective_ops_total{op="all_reduce"} for ranks 0, 1 and 2 (19 done
#     by each), and promtool check metrics accepts it;
# then the job completes (agent exit 0) with every sum checked by the workers.
#   args: AGENT LIBTDIST_SO PACKAGE_INIT_PY STALL_TRAIN_PY
set -uo pipefail
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
. "$LIB/torch.sh"
exec 9>&2
T="${TEST_TMPDIR:-$(mktemp -d)}/agent_torch.$$"
P="$T/prefix"
mkdir -p "$P/bin" "$P/lib" "$P/python/tdist_torch"
cp "$(realpath "$1")" "$P/bin/tdist-agent"
cp "$(realpath "$2")" "$P/lib/libtdist.so"
# The package's Python files, as the image installs them (__init__.py and the modules beside it).
cp "$(dirname "$3")"/*.py "$P/python/tdist_torch/"
cp "$(realpath "$4")" "$T/stall_train.py"
# The C++ group built for this PyTorch, installed as build_ext.py installs it: beside the package
# under the name tdist_torch looks for. TDIST_TORCH_IMPL=cpp (torch.sh) makes a worker fail
# without it, and the workers print which half runs.
ext_name="$("$PY" -c 'import sys, torch
print("_tdist_c-torch%s-%s.so" % (torch.__version__.split("+")[0], sys.implementation.cache_tag))')"
cp "${TDIST_TORCH_EXT:?the test has no C++ group (torch_ext = True)}" "$P/python/tdist_torch/$ext_name"
unset TDIST_TORCH_EXT
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cleanup() { for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
unset PYTHONPATH TDIST_LIBRARY
export TDIST_STALL_REPORT_SECONDS=2 TDIST_LOG_LEVEL=info
N=20
bounded 150 "$P/bin/tdist-agent" --standalone --nproc-per-node 3 --http-port 0 \
  --http-port-file "$T/port" --monitor-interval 0.05 -- "$T/stall_train.py" 40 2 $N 7 \
  >"$T/agent.out" 2>"$T/agent.err" &
apid=$!
for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
HP=$(cat "$T/port" 2>/dev/null)
[ -n "$HP" ] || { echo "FAIL: no HTTP port ($(tail -3 "$T/agent.err"))"; exit 1; }

summary=""
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$HP/status" >"$T/status.json" 2>/dev/null &&
    summary=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("collectives") or "")' "$T/status.json")
  case "$summary" in *stuck*hold*) break ;; esac
  sleep 0.1
done
echo "/status collectives: $summary"
if /usr/bin/python3 - "$summary" $N <<'PYEOF'
import re, sys
s, n = sys.argv[1], int(sys.argv[2])
m = re.match(r"ranks? ([0-9,]+) stuck in all_reduce #(\d+) for [0-9.]+ s; ranks? ([0-9,]+) holds? them up", s)
assert m, s
assert sorted(int(x) for x in m.group(1).split(",")) == [0, 1], m.group(1)
assert int(m.group(2)) == n, m.group(2)
assert m.group(3) == "2", m.group(3)
PYEOF
then pass "/status names PyTorch rank 2 alone as holding ranks 0,1 up in all_reduce #$N"
else fail "/status collectives: '$summary'"; fi

curl -sf "http://127.0.0.1:$HP/metrics" >"$T/metrics"
if /usr/bin/python3 - "$T/metrics" $N <<'PYEOF'
import re, sys
text, n = open(sys.argv[1]).read(), int(sys.argv[2])
ops = {}
for line in text.splitlines():
    m = re.match(r'tdist_collective_ops_total\{([^}]*)\} (\S+)$', line)
    if not m:
        continue
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    if labels.get("op") == "all_reduce":
        ops[int(labels["rank"])] = float(m.group(2))
assert sorted(ops) == [0, 1, 2], ops
assert all(v == n - 1 for v in ops.values()), ops
print("all_reduce ops per rank:", ops)
PYEOF
then pass "/metrics: tdist_collective_ops_total{op=\"all_reduce\"} = $((N - 1)) for PyTorch ranks 0, 1, 2"
else fail "/metrics per-rank counters: $(grep tdist_collective_ops_total "$T/metrics" | head -5)"; fi
promtool check metrics <"$T/metrics" >"$T/promtool.out" 2>&1 && pass "promtool check metrics" ||
  fail "promtool: $(head -5 "$T/promtool.out")"

wait "$apid"; rc=$?
[ $rc -eq 0 ] && pass "the job completed (agent exit 0)" || fail "agent exit $rc: $(tail -5 "$T/agent.err")"
grep -q "tdist_torch from $P/python/tdist_torch/__init__.py" "$T/agent.out" "$T/agent.err" &&
  pass "workers imported tdist_torch from the agent's PREFIX/python" ||
  fail "workers' tdist_torch: $(grep -h 'tdist_torch from' "$T"/agent.* | head -2)"
grep -q "implementation cpp ($P/python/tdist_torch/$ext_name)" "$T/agent.out" &&
  pass "workers ran the C++ group installed beside the package ($ext_name)" ||
  fail "workers' implementation: $(grep -h 'implementation' "$T"/agent.out | head -2)"
[ $fails -eq 0 ] && echo "PASS: all checks" || echo "FAIL: $fails check(s)"
exit $((fails > 0))
