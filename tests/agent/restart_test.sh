#!/usr/bin/env bash
# Restarts as users meet them: a job under tdist-agent --standalone with 2 workers in which one
# rank crashes mid-training (after init_process_group, at a random step, as an exception, an exit
# or a signal) on each of the first N attempts (default 20) must restart N times in a row and
# succeed on attempt N, with zero failures. Every worker also checks attempt isolation before it
# joins (--check-fresh-store: the store its MASTER_PORT names counts no rank start of an earlier
# attempt; a stale key exits 99 / 4, which would use up a restart and fail the job), and every
# attempt must get its own workers' store (a MASTER_PORT no earlier attempt had).
#   args: WORKER AGENT TRAIN_BIN DDP_SCRIPT
#   WORKER: torch (the DDP script under the PyTorch of $TDIST_TORCH, tests/testlib/torch.sh)
#           or c (the C training example, libtdist env://)
#   TDIST_RESTART_TEST_RESTARTS=N changes N; TDIST_TEST_SEED fixes the seed.
set -uo pipefail
WORKER="$1"; AGENT="$(realpath "$2")"; TRAIN="$(realpath "$3")"; DDP="$(realpath "$4")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
exec 9>&2
N="${TDIST_RESTART_TEST_RESTARTS:-20}"
SEED="${TDIST_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}"
T="${TEST_TMPDIR:-$(mktemp -d)}/restart.$$"; mkdir -p "$T"
case "$WORKER" in
  torch)
    . "$LIB/torch.sh"
    what="PyTorch $TORCH_VERSION DDP"
    cmd=("$DDP" --steps 30 --crash-until-attempt "$N" --seed "$SEED" --check-fresh-store) ;;
  c)
    what="C example"
    cmd=("$TRAIN" --steps 200 --print-every 0 --crash-until-attempt "$N" --seed "$SEED"
         --check-fresh-store) ;;
  *) echo "FAIL: WORKER must be torch or c, not '$WORKER'"; exit 1 ;;
esac
echo "restart_test: $what, $N crashing attempts, seed $SEED (TDIST_TEST_SEED=$SEED replays)"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod

t0=$(date +%s)
TDIST_LOG_LEVEL=info bounded $((60 + N * 20)) "$AGENT" --http-port -1 --monitor-interval 0.05 \
  --stop-grace-period 5 --standalone --nproc-per-node 2 --max-restarts "$N" -- "${cmd[@]}" \
  >"$T/out" 2>"$T/err"
rc=$?
secs=$(($(date +%s) - t0))
restarts=$(grep -c 'restarting the workers' "$T/err")
crashes=$(cat "$T/out" "$T/err" | grep -c 'crashing at step')
if [ $rc -eq 0 ]; then pass "$what: job succeeded after $restarts restart(s) in $secs s"
else
  fail "$what: agent exited $rc after $restarts restart(s)"
  grep -E 'root cause|message:|earlier attempt|giving up' "$T/err" "$T/out" | tail -n 12
fi
[ "$restarts" = "$N" ] && [ "$crashes" = "$N" ] &&
  pass "$N crashes mid-training, $N restarts, none failed" ||
  fail "expected $N crashes and $N restarts, saw $crashes and $restarts"
if [ "$WORKER" = torch ]; then
  grep -q "^ddp_train: PyTorch $TORCH_VERSION, world 2, attempt $N" "$T/out" &&
  grep -q "done: world 2 attempt $N .*params identical: True" "$T/out" &&
    pass "attempt $N trained to the end with identical parameters" ||
    fail "no final line of attempt $N: $(tail -n 2 "$T/out")"
else
  grep -q "train: OK: .*bitwise identical on all 2 ranks (attempt $N)" "$T/out" &&
    pass "attempt $N trained to the end with identical parameters" ||
    fail "no final line: $(tail -n 2 "$T/out")"
fi
if grep -q "earlier attempt" "$T/out" "$T/err"; then fail "a worker saw an earlier attempt's keys"
else pass "no worker saw a key of an earlier attempt (--check-fresh-store)"; fi
ports=$(sed -n 's/.*started 2 worker(s).*MASTER_PORT=\([0-9]*\).*/\1/p' "$T/err")
# The next round's store is bound while the last one still listens, so two attempts in a row
# never share a port; a port of an attempt long gone may come back from bind(0) (its workers
# are stopped), which --check-fresh-store above shows does not leak keys.
[ "$(echo "$ports" | wc -l)" = $((N + 1)) ] && [ "$(echo "$ports" | uniq | wc -l)" = $((N + 1)) ] &&
  pass "each of the $((N + 1)) attempts had its own workers' store (a new port each restart)" ||
  fail "MASTER_PORT per attempt: $(echo "$ports" | tr '\n' ' ')"
agent_test_end restart_test
