#!/usr/bin/env bash
# End-to-end test of the training example: run_local.sh starts real processes that meet over
# env:// (rank 0 hosts the store on a free port) and train over real sockets.
#   - 2 ranks (linear) and 3 ranks (logistic, an odd world size) must succeed: the program itself
#     checks that the parameters are bitwise identical on every rank and that the loss fell;
#   - rank 0's reported loss must fall between the first and last report;
#   - 2 ranks over TCP only (TDIST_SHM=0), and 2 ranks joining a store hosted by someone else
#     (a real PyTorch TCPStore as torchrun's agent, TORCHELASTIC_USE_AGENT_STORE=True);
#   - with --lr 0 the loss cannot fall: every rank must exit non-zero (the check can fail);
#   - without RANK the program must fail with PyTorch's env:// message.
# usage (from Bazel): train_test.sh TRAIN_BIN RUN_LOCAL_SH
set -euo pipefail
train="$1"
runner="$2"
export TRAIN_BIN="$train" TRAIN_TIMEOUT_S=60
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

# First and last "step N loss X" values printed by rank 0.
loss_at() { grep -E '^\[rank 0\] step +[0-9]+ +loss' "$1" | sed -E 's/.*loss ([0-9.e+-]+).*/\1/' | sed -n "$2"; }

echo "== 2 ranks, linear regression"
bash "$runner" 2 --steps 150 --print-every 50 --seed 3 >"$tmp/two.out" 2>&1 || {
  cat "$tmp/two.out"; fail "2 ranks failed"; }
cat "$tmp/two.out"
grep -q '^\[rank 0\] train: OK: .* bitwise identical on all 2 ranks' "$tmp/two.out" || fail "no OK line (2 ranks)"
[[ "$(grep -c 'joined' "$tmp/two.out")" == 2 ]] || fail "expected 2 ranks to join"
first="$(loss_at "$tmp/two.out" 1p)"
last="$(loss_at "$tmp/two.out" '$p')"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 10) }' || fail "loss $first -> $last did not fall 10x"

echo "== 3 ranks, logistic regression"
bash "$runner" 3 --model logistic --steps 200 --lr 0.5 --features 8 --batch 32 --print-every 100 \
  >"$tmp/three.out" 2>&1 || { cat "$tmp/three.out"; fail "3 ranks failed"; }
cat "$tmp/three.out"
grep -q '^\[rank 0\] train: OK: .* bitwise identical on all 3 ranks' "$tmp/three.out" || fail "no OK line (3 ranks)"
for r in 0 1 2; do grep -q "^\[rank $r\] train: rank $r of 3 joined (LOCAL_RANK $r" "$tmp/three.out" || fail "rank $r did not join"; done

echo "== 2 ranks over TCP only (TDIST_SHM=0)"
TDIST_SHM=0 bash "$runner" 2 --steps 100 --print-every 0 >"$tmp/tcp.out" 2>&1 || {
  cat "$tmp/tcp.out"; fail "2 ranks over TCP failed"; }
grep -q '^\[rank 0\] train: OK: .* bitwise identical on all 2 ranks' "$tmp/tcp.out" || {
  cat "$tmp/tcp.out"; fail "no OK line (TCP)"; }

echo "== 2 ranks joining an agent's store (TORCHELASTIC_USE_AGENT_STORE=True, PyTorch TCPStore)"
# A real PyTorch 1.13 TCPStore plays torchrun's agent: the ranks must not host a store, must use
# the "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" prefix as torch workers do, and train.
/usr/bin/python3 - "$tmp" <<'PY' >"$tmp/agent.out" 2>&1 &
import os, sys, time
from datetime import timedelta
from torch.distributed import TCPStore
d = sys.argv[1]
s = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
open(d + "/port.tmp", "w").write(str(s.port))
os.rename(d + "/port.tmp", d + "/port")
deadline = time.time() + 60
while not os.path.exists(d + "/done") and time.time() < deadline:
    time.sleep(0.05)
s.set_timeout(timedelta(seconds=2))
key = "/worker/attempt_2/default_pg/gloo/1"
try:
    ok = len(s.get(key)) > 0
except Exception as e:
    print(e)
    ok = False
print("agent store: %s present: %s" % (key, ok))
sys.exit(0 if ok else 1)
PY
agent=$!
for _ in $(seq 400); do [[ -s "$tmp/port" ]] && break; sleep 0.05; done
[[ -s "$tmp/port" ]] || { cat "$tmp/agent.out"; fail "the PyTorch store did not start"; }
rc=0
MASTER_PORT="$(cat "$tmp/port")" TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=2 \
  bash "$runner" 2 --steps 50 --print-every 0 >"$tmp/agent_train.out" 2>&1 || rc=$?
touch "$tmp/done"
arc=0
wait "$agent" || arc=$?
cat "$tmp/agent_train.out" "$tmp/agent.out"
[[ $rc == 0 ]] || fail "training against the agent's store failed ($rc)"
grep -q 'store: listening' "$tmp/agent_train.out" && fail "rank 0 hosted a store in agent mode"
[[ $arc == 0 ]] || fail "the ranks' keys are not under /worker/attempt_2 in the agent's store"

echo "== --lr 0 must fail the loss check"
rc=0
bash "$runner" 2 --steps 20 --lr 0 >"$tmp/lr0.out" 2>&1 || rc=$?
cat "$tmp/lr0.out"
[[ $rc == 1 ]] || fail "expected exit status 1 with --lr 0, got $rc"
grep -q 'the loss did not decrease' "$tmp/lr0.out" || fail "no loss-check message"

echo "== missing RANK"
rc=0
env -u RANK WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$train" >"$tmp/norank.out" 2>&1 || rc=$?
cat "$tmp/norank.out"
[[ $rc == 3 ]] || fail "expected exit status 3 without RANK, got $rc"
grep -q 'environment variable RANK expected, but not set' "$tmp/norank.out" || fail "no RANK message"

echo "== bad option"
rc=0
"$train" --steps x >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "expected exit status 2 for a bad option, got $rc"
"$train" --help >"$tmp/help.out" || fail "--help exited non-zero"
grep -q -- '--steps N' "$tmp/help.out" || fail "--help lacks --steps"

echo "PASS"
