#!/usr/bin/env bash
# No shared-memory segment outlives a worker across tdist-agent's restarts in one pod: a job of
# 3 workers (the C training example, gloo over shared memory) under one standalone agent, in
# which a random worker is killed with SIGKILL at a random moment of each attempt (from right
# after the workers start, inside init_process_group's set-up, to well into training) N times
# (default 10); the agent restarts the workers each time, stopping the survivors as it does. At
# each kill and after the agent has ended (SIGTERM after the last attempt started), /dev/shm
# must hold nothing. It runs in a private mount namespace on a fresh tmpfs /dev/shm, as a pod's
# memory-backed emptyDir (root, as in CI; elsewhere a skip, which fails unless
# TDIST_TEST_ALLOW_SKIP=1), so other jobs' segments never count.
#   args: AGENT TRAIN_BIN
#   TDIST_SHM_RESTART_KILLS=N changes N; TDIST_TEST_SEED fixes the choices (timing is the machine's).
set -uo pipefail
AGENT="$(realpath "$1")"; TRAIN="$(realpath "$2")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
. "$LIB/skip.sh"
if [ "${SHM_RESTART_INNER:-}" != 1 ]; then
  # Re-run this script in a private mount namespace with its own /dev/shm.
  if ! unshare -m --propagation private true 2>/dev/null; then
    test_skip "shm_restart_test: cannot make a private mount namespace (unshare -m); needs root"
    exit $?
  fi
  SHM_RESTART_INNER=1 exec unshare -m --propagation private bash -c \
    'mount -t tmpfs -o size=256m tdist-restart-shm /dev/shm || exit 97; exec bash "$0" "$@"' \
    "$(realpath "$0")" "$@"
fi
exec 9>&2
N="${TDIST_SHM_RESTART_KILLS:-10}"
NP=3
SEED="${TDIST_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}"
RANDOM=$SEED
T="${TEST_TMPDIR:-$(mktemp -d)}/shmrestart.$$"; mkdir -p "$T"
echo "shm_restart_test: $NP workers, $N kills, seed $SEED (TDIST_TEST_SEED=$SEED replays the choices)"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
shm_ls() { find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\n' | sort; }
workers() { # the agent's descendants running the training program
  local p
  for p in $(_bounded_tree "$agent"); do
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$TRAIN" ] && echo "$p"
  done
}

[ -z "$(shm_ls)" ] || { fail "the fresh /dev/shm is not empty: $(shm_ls)"; exit 1; }
TDIST_LOG_LEVEL=info bounded $((120 + N * 20)) "$AGENT" --http-port -1 --monitor-interval 0.05 \
  --stop-grace-period 5 --standalone --nproc-per-node $NP --max-restarts "$N" -- \
  "$TRAIN" --steps 100000000 --print-every 0 >"$T/out" 2>"$T/err" 9>&- &
agent=$!
kills=0 mapped=0 named=0
logged() { grep -c "$1" "$T/err"; }
shopt -s nullglob
for ((k = 0; k < N; k++)); do
  # Half the kills: the moment a name shows in /dev/shm (the window in which a named segment
  # leaked; its owner, the pid in the name, is the victim), polled for up to 1 s with builtins
  # only (a glob, no fork).
  victim=""
  if [ $((RANDOM % 2)) = 0 ]; then
    end=$((${EPOCHREALTIME/./} + 1000000))
    while [ "${EPOCHREALTIME/./}" -lt $end ]; do
      names=(/dev/shm/*)
      [ ${#names[@]} = 0 ] && continue
      p=${names[0]#/dev/shm/tdist-}
      p=${p%%-*}
      if [[ "$p" =~ ^[0-9]+$ ]] && kill -KILL "$p" 2>/dev/null; then
        victim=$p
        kills=$((kills + 1))
        named=$((named + 1))
      fi
      break
    done
  fi
  if [ -z "$victim" ]; then
    # This attempt's workers (the last attempt's were stopped before the agent logged its
    # restart); then a random one after a random delay, mostly inside the first 50 ms
    # (connecting, shared-memory set-up), some well into training.
    deadline=$((SECONDS + 60))
    while [ "$(workers | wc -w)" -lt $NP ]; do
      if [ $SECONDS -gt $deadline ] || ! kill -0 "$agent" 2>/dev/null; then
        fail "attempt $k: its $NP workers did not start (agent log below)"; tail -n 20 "$T/err"
        break 2
      fi
      sleep 0.01
    done
    cur=$(workers)
    if [ $((RANDOM % 3)) = 0 ]; then ms=$((RANDOM % 800)); else ms=$((RANDOM % 50)); fi
    sleep "$(printf '0.%03d' "$ms")"
    set -- $cur
    i=$((RANDOM % NP + 1))
    victim=${!i}
    # Whether the workers map shared memory (unnamed segments show in their maps as
    # /dev/shm/#<inode> (deleted)), and what the pod's /dev/shm holds at that moment.
    for p in $cur; do grep -q ' /dev/shm/' "/proc/$p/maps" 2>/dev/null && { mapped=$((mapped + 1)); break; }; done
    names=(/dev/shm/*)
    [ ${#names[@]} = 0 ] || named=$((named + 1))
    kill -KILL "$victim" 2>/dev/null && kills=$((kills + 1))
  fi
  # The agent stops the survivors and restarts: the next kill is in the next attempt.
  deadline=$((SECONDS + 60))
  while [ "$(logged 'restarting the workers')" -le $k ] && [ $SECONDS -le $deadline ]; do
    kill -0 "$agent" 2>/dev/null || break
    sleep 0.01
  done
done
# The last attempt: let it run, then stop the agent as Kubernetes stops a pod.
deadline=$((SECONDS + 60))
while [ "$(workers | wc -w)" -lt $NP ] && [ $SECONDS -le $deadline ] && kill -0 "$agent" 2>/dev/null; do
  sleep 0.05
done
sleep 0.3
for p in $(_bounded_tree "$agent"); do # the agent itself (parents first), not bounded's shell
  [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$AGENT" ] && { kill -TERM "$p"; break; }
done
wait "$agent"
rc=$?
restarts=$(grep -c 'restarting the workers' "$T/err")
[ "$restarts" = "$N" ] && pass "$kills workers killed at random moments, $restarts restarts" ||
  fail "expected $N restarts after $kills kills, the agent logged $restarts (exit $rc)"
[ "$mapped" -gt 0 ] && pass "at $mapped of $kills kills the workers had shared memory mapped" ||
  fail "the workers never mapped shared memory: the test ran over TCP only"
left=$(shm_ls)
[ "$named" = 0 ] && pass "/dev/shm held no name at any of the $kills kills" ||
  fail "/dev/shm held names at $named of the $kills kills"
[ -z "$left" ] && pass "/dev/shm is empty after the agent ended" ||
  fail "left in /dev/shm after the agent ended: $(echo $left)"
agent_test_end shm_restart_test
