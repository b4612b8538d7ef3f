#!/usr/bin/env bash
# PyTorch's NCCL flight-recorder dumps through the real agent (no GPU here: the workers write dump
# files in PyTorch's pickle format themselves, where ProcessGroupNCCL's watchdog would on a
# collective timeout, then exit 1 as its teardown does), and the workers' environment for Python
# stacks and the flight recorder:
#   a. 3 workers; rank 1 never enqueued collective #7, ranks 0 and 2 wait in it: the agent logs
#      the flight recorder's verdict, the failure record ("giving up ...") names rank 1, and the
#      run directory is kept with the dumps; each worker had TORCH_NCCL_DEBUG_INFO_TEMP_FILE in
#      its attempt directory, the agent's sitecustomize directory first on PYTHONPATH (the
#      user's entries after it), TDIST_PY_STACKS_* consumed at start-up, and the user's own
#      TORCH_NCCL_TRACE_BUFFER_SIZE kept;
#   b. TDIST_PY_STACKS=0: no sitecustomize on PYTHONPATH; no dump, no verdict, exit 0;
#   c. TDIST_PY_STACKS=maybe: the agent refuses to start (exit 64) and names the variable.
#   args: AGENT
set -uo pipefail
AGENT="$(realpath "$1")"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, agent_test_end
T="${TEST_TMPDIR:-$(mktemp -d)}/frec.$$"
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
export TDIST_LOG_LEVEL=info TDIST_PYTHON=/usr/bin/python3
PY=/usr/bin/python3

cat >"$T/worker.py" <<'PYEOF'
import json, os, pickle, sys
rank = int(os.environ["RANK"])
json.dump(dict(os.environ), open(os.path.join(sys.argv[1], "env.%d.json" % rank), "w"))
prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
if sys.argv[2] == "dump":
    enq = 6 if rank == 1 else 7
    entries = [dict(record_id=s - 1, pg_id=0, process_group=("0", "default_pg"),
                    collective_seq_id=s, p2p_seq_id=0, op_id=s, profiling_name="nccl:all_reduce",
                    time_created_ns=s, input_sizes=[[4]], input_dtypes=["Float"],
                    output_sizes=[[4]], output_dtypes=["Float"],
                    state="completed" if s <= 6 else "started", time_discovered_started_ns=s,
                    time_discovered_completed_ns=s if s <= 6 else None, retired=s <= 6,
                    timeout_ms=600000, is_p2p=False) for s in range(1, enq + 1)]
    status = {"0": dict(last_enqueued_collective=enq, last_started_collective=-1,
                        last_completed_collective=6)}
    with open(prefix + str(rank), "wb") as f:
        pickle.dump(dict(version="2.4", pg_config={}, pg_status=status, entries=entries), f, 2)
    sys.exit(1)
PYEOF

# a. dumps, a verdict, the environment.
mkdir -p "$T/a" "$T/user"
PYTHONPATH="$T/user" TORCH_NCCL_TRACE_BUFFER_SIZE=500 timeout 120 "$AGENT" --standalone \
  --nproc-per-node 3 --max-restarts 0 --log-dir "$T/a" -- "$T/worker.py" "$T/a" dump \
  >"$T/a.out" 2>"$T/a.err"
rc=$?
[ $rc -eq 1 ] && pass "a. exit 1 (the workers' code)" || fail "a. exit $rc: $(tail -3 "$T/a.err")"
want="rank 1 behind in process group 0 (last enqueued #6); ranks 0,2 wait in nccl:all_reduce #7"
grep -q "PyTorch flight recorder (dumps .*nccl_trace_rank_\*): $want" "$T/a.err" &&
  pass "a. the agent logs the flight recorder's verdict" ||
  fail "a. no verdict: $(grep -i flight "$T/a.err")"
grep 'giving up' "$T/a.err" | grep -q "flight recorder: $want" &&
  pass "a. the failure record names rank 1" || fail "a. failure record: $(grep 'giving up' "$T/a.err")"
n=$(find "$T/a" -name 'nccl_trace_rank_[0-9]' | wc -l)
grep -q "keeping the run directory" "$T/a.err" && [ "$n" -eq 3 ] &&
  pass "a. the run directory is kept with the 3 dumps" || fail "a. $n dumps kept: $(grep 'run dir' "$T/a.err")"
$PY - "$T/a" "$T/user" <<'PYEOF' && pass "a. the workers' environment" || fail "a. the workers' environment"
import json, sys
d, user = sys.argv[1], sys.argv[2]
for r in range(3):
    e = json.load(open("%s/env.%d.json" % (d, r)))
    pp = e["PYTHONPATH"].split(":")
    assert pp[0].endswith("/python") and pp[0].startswith(d + "/") and pp[1:] == [user], pp
    assert e["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(d + "/") and \
        e["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].endswith("/attempt_0/nccl_trace_rank_"), e
    assert e["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500", e["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    assert e["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert not [k for k in e if k.startswith("TDIST_PY_STACKS_")], sorted(e)
PYEOF

# b. TDIST_PY_STACKS=0.
mkdir -p "$T/b"
TDIST_PY_STACKS=0 timeout 120 "$AGENT" --standalone --nproc-per-node 2 --max-restarts 0 \
  --log-dir "$T/b" -- "$T/worker.py" "$T/b" none >"$T/b.out" 2>"$T/b.err"
rc=$?
[ $rc -eq 0 ] && ! grep -qi "flight recorder" "$T/b.err" &&
  pass "b. no dump: exit 0, no verdict" || fail "b. exit $rc: $(grep -i flight "$T/b.err")"
$PY - "$T/b" <<'PYEOF' && pass "b. off: no sitecustomize, no stacks variables" || fail "b. off: environment"
import json, sys
for r in range(2):
    e = json.load(open("%s/env.%d.json" % (sys.argv[1], r)))
    assert not e.get("PYTHONPATH", "").split(":")[0].endswith("/python"), e.get("PYTHONPATH")
    assert not [k for k in e if k.startswith("TDIST_PY_STACKS_")], sorted(e)
PYEOF

# c. a bad value.
TDIST_PY_STACKS=maybe timeout 60 "$AGENT" --standalone --nproc-per-node 1 -- /bin/true \
  >"$T/c.out" 2>"$T/c.err"
rc=$?
[ $rc -eq 64 ] && grep -q "TDIST_PY_STACKS='maybe'" "$T/c.err" &&
  pass "c. TDIST_PY_STACKS=maybe: exit 64, named" || fail "c. exit $rc: $(cat "$T/c.err")"

agent_test_end flight_recorder_test
