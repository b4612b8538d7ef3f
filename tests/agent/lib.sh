# shellcheck shell=bash
# Sourced by the end-to-end agent tests (tests/agent/*_test.sh), after `set`: the bookkeeping each
# one used to define for itself. Defines nothing else and starts nothing.
#   pass MSG, fail MSG    print "PASS: MSG" / "FAIL: MSG"; fail counts in $fails (the test goes on)
#   agent_test_end NAME   prints "NAME: N failure(s)"; returns 0 only when no check failed (the
#                         test's last line, so its exit status)
#   agent_started PID     an agent the test started in the background: it is $APID, and
#                         agent_kill_all (the test's EXIT trap) kills it with SIGKILL
#   agent_in_pod I        the agent pods_exec just started in pod job-I (its $PODS_PID, see
#                         pods/pods.sh) is ${APID[I]}, for the scenarios that wait for or kill it
fails=0
AGENT_PIDS=()

pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

agent_test_end() {
  echo "$1: $fails failure(s)"
  [ "$fails" -eq 0 ]
}

agent_started() {
  # shellcheck disable=SC2034 # read by the sourcing test
  APID=$1
  AGENT_PIDS+=("$1")
}

agent_kill_all() {
  local p
  for p in "${AGENT_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
}

agent_in_pod() {
  declare -gA APID
  # shellcheck disable=SC2034 # read by the sourcing test
  APID[$1]=$PODS_PID
}
