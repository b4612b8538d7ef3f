#!/usr/bin/env bash
# No process a worker started outlives tdist-agent, however the agent ends (issue 14, item 9).
# Each worker (a shell script, 2 per agent) starts three background processes and records them:
# `sleep 1000 &` (in the worker's process group), `setsid sleep 1000 &` (a child in a session of
# its own) and a double-forked `setsid sh -c '...; exec sleep 1000'` that also ignores SIGTERM (an
# orphan of a subshell from the start). Then, with every pid recorded (and its start time, so a
# reused pid is not mistaken for a survivor):
#   a. kill -9 of the agent (the pid that was started): every worker and background process is
#      gone within 10 s, and the exit status is 137;
#   b. kill -9 of the workers' parent process (the agent proper): the same, exit status 137;
#   c. a SIGHUP to the agent's process group reaches each worker once (not once per agent
#      process), then kill -9 of that whole process group: the same, every process gone;
#   d. a worker failure with restarts exhausted (exit 3), a job that succeeds (exit 0) and SIGTERM
#      (exit 143): every process is gone by the time the agent has exited;
#   e. a restart: attempt 0's processes are gone while attempt 1 runs;
#   f. as PID 1 of a pid namespace (unshare, root only), kill -9 from outside: nothing is left in
#      the namespace (the kernel kills it; the agent runs no guard there).
#   args: AGENT
set -uo pipefail
AGENT="$(realpath "$1")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
. "$LIB/skip.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/orphans.$$"
mkdir -p "$T"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
export TDIST_LOG_LEVEL=info
exec 9>&2

# Every process recorded in any scenario, killed at exit whatever happened (on a broken agent they
# would otherwise outlive the test).
cleanup() {
  local p
  for p in $(cat "$T"/*.pids* 2>/dev/null | awk '{print $2}'); do
    [ "$p" -gt 1 ] 2>/dev/null && kill -KILL "$p" 2>/dev/null
  done
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT

cat >"$T/worker.sh" <<'SH'
# env: PIDS (file prefix), MODE (wait | exit:N | fail0), GO (file); records "KIND PID" lines in
# $PIDS$TORCHELASTIC_RESTART_COUNT.
f="$PIDS$TORCHELASTIC_RESTART_COUNT"
trap 'echo "hup $LOCAL_RANK" >> "$f"' HUP
echo "worker $$ $PPID" >> "$f"
sleep 1000 & echo "bg $!" >> "$f"
setsid sleep 1000 & echo "setsid $!" >> "$f"
(setsid sh -c 'trap "" TERM; echo "daemon $$" >> "$0"; exec sleep 1000' "$f" &)
case "$MODE" in
  exit:*) for _ in $(seq 100); do [ "$(grep -c '^daemon' "$f")" -ge 2 ] && break; sleep 0.05; done
          exit "${MODE#exit:}" ;;
  fail0) [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && {
           for _ in $(seq 100); do [ "$(grep -c '^daemon' "$f")" -ge 2 ] && break; sleep 0.05; done
           exit 3; } ;;
esac
while [ ! -e "$GO" ]; do sleep 0.05; done
SH

# recorded FILE N: waits (10 s at most) until FILE has N lines of each kind; 1 if it never does.
recorded() {
  local f="$1" n="$2" k ok
  for _ in $(seq 200); do
    ok=1
    for k in worker bg setsid daemon; do
      [ "$(grep -c "^$k " "$f" 2>/dev/null || true)" -ge "$n" ] 2>/dev/null || ok=0
    done
    [ $ok = 1 ] && return 0
    sleep 0.05
  done
  return 1
}

# snapshot FILE: "PID STARTTIME" of every recorded process into FILE.snap (a pid alive later with
# another start time is a new process that reused the number).
snapshot() {
  local p
  : >"$1.snap"
  for p in $(awk '{print $2}' "$1"); do
    echo "$p $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $20}')" >>"$1.snap"
  done
}

# survivors FILE: the recorded processes still alive (not gone, not a zombie), as "PID(kind)".
survivors() {
  local p st s0 s
  while read -r p s0; do
    s="$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null)" || continue
    st="${s%% *}"
    [ -n "$s" ] && [ "$st" != Z ] && [ "$(echo "$s" | awk '{print $20}')" = "$s0" ] &&
      echo -n "$p($(awk -v p="$p" '$2 == p {print $1}' "$1")) "
  done <"$1.snap"
}

# gone_within SECS FILE: 0 once no recorded process of FILE is alive, 1 after SECS seconds.
gone_within() {
  for _ in $(seq $(($1 * 20))); do [ -z "$(survivors "$2")" ] && return 0; sleep 0.05; done
  return 1
}

start_agent() { # NAME MODE ARGS...: starts the agent in the background (apid), PIDS=$T/NAME.pids
  local name="$1"
  export PIDS="$T/$name.pids" MODE="$2" GO="$T/$name.go"
  shift 2
  "$AGENT" --http-port -1 --monitor-interval 0.05 --stop-grace-period 2 --standalone \
    --nproc-per-node 2 "$@" -- bash "$T/worker.sh" >/dev/null 2>"$T/$name.err" &
  apid=$!
}

# a. kill -9 of the agent
start_agent a wait
if recorded "$T/a.pids0" 2; then
  snapshot "$T/a.pids0"
  parent="$(awk '/^worker/ {print $3; exit}' "$T/a.pids0")"
  kill -KILL $apid; wait $apid; rc=$?
  if gone_within 10 "$T/a.pids0"; then pass "a. kill -9 of the agent: every worker and its processes gone"
  else fail "a. kill -9 of the agent: left behind: $(survivors "$T/a.pids0")"; fi
  [ $rc -eq 137 ] && pass "a. exit status 137" || fail "a. exit status $rc, want 137"
  # The workers' parent (the agent proper, when the pid started was its guard) stops them and
  # exits too.
  for _ in $(seq 100); do st="$(sed 's/.*) //' "/proc/$parent/stat" 2>/dev/null)"; [ -z "$st" ] || [ "${st%% *}" = Z ] && break; sleep 0.05; done
  [ -z "$st" ] || [ "${st%% *}" = Z ] && pass "a. the workers' parent (pid $parent) has exited" ||
    fail "a. the workers' parent (pid $parent) still runs: $(tr '\0' ' ' <"/proc/$parent/cmdline")"
  [ "$parent" = "$apid" ] || grep -q "the guard process (pid $apid) is gone: stopping the workers" "$T/a.err" &&
    pass "a. the agent saw its guard die and stopped its workers" ||
    fail "a. no 'guard process is gone' line: $(tail -3 "$T/a.err")"
else fail "a. workers did not record their processes: $(cat "$T/a.pids0" 2>/dev/null | tr '\n' ' ')"; kill -KILL $apid; fi

# b. kill -9 of the workers' parent (the agent proper; the pid started is then its guard)
start_agent b wait
if recorded "$T/b.pids0" 2; then
  snapshot "$T/b.pids0"
  parent="$(awk '/^worker/ {print $3; exit}' "$T/b.pids0")"
  kill -KILL "$parent"; wait $apid; rc=$?
  if gone_within 10 "$T/b.pids0"; then pass "b. kill -9 of the workers' parent (pid $parent): every process gone"
  else fail "b. kill -9 of the workers' parent: left behind: $(survivors "$T/b.pids0")"; fi
  [ $rc -eq 137 ] && pass "b. exit status 137 (128 + SIGKILL)" || fail "b. exit status $rc, want 137"
else fail "b. workers did not record their processes"; kill -KILL $apid; fi

# c. the agent in a process group of its own (setsid: $! is the agent, exec'd in place): SIGHUP to
#    the group reaches each worker once; then SIGKILL to the group.
export PIDS="$T/c.pids" MODE=wait GO="$T/c.go"
setsid "$AGENT" --http-port -1 --monitor-interval 0.05 --stop-grace-period 2 --standalone \
  --nproc-per-node 2 -- bash "$T/worker.sh" >/dev/null 2>"$T/c.err" &
apid=$!
if recorded "$T/c.pids0" 2; then
  snapshot "$T/c.pids0"
  kill -HUP -- -"$apid"
  for _ in $(seq 100); do [ "$(grep -c '^hup' "$T/c.pids0")" -ge 2 ] && break; sleep 0.05; done
  sleep 0.5 # a second delivery would come within this
  [ "$(grep -c '^hup 0$' "$T/c.pids0")" = 1 ] && [ "$(grep -c '^hup 1$' "$T/c.pids0")" = 1 ] &&
    pass "c. SIGHUP to the agent's process group reaches each worker once" ||
    fail "c. SIGHUP to the group: $(grep '^hup' "$T/c.pids0" | tr '\n' ' ')"
  kill -KILL -- -"$apid"; wait $apid
  if gone_within 10 "$T/c.pids0"; then pass "c. kill -9 of the agent's process group: every process gone"
  else fail "c. kill -9 of the process group: left behind: $(survivors "$T/c.pids0")"; fi
else fail "c. workers did not record their processes"; kill -KILL -- -"$apid"; fi

# d. the agent exits on its own: a failure (restarts exhausted), a success, SIGTERM.
for case in "fail exit:3 3" "success go 0" "term wait 143"; do
  set -- $case
  name=d-$1
  start_agent "$name" "${2/go/wait}"
  if recorded "$T/$name.pids0" 2; then
    snapshot "$T/$name.pids0"
    [ "$1" = success ] && touch "$GO"
    [ "$1" = term ] && kill -TERM $apid
    # bounded: a hang fails this case, it does not stop the test
    for _ in $(seq 300); do kill -0 $apid 2>/dev/null || break; sleep 0.05; done
    kill -KILL $apid 2>/dev/null; wait $apid; rc=$?
    left="$(survivors "$T/$name.pids0")"
    [ $rc -eq "$3" ] && [ -z "$left" ] &&
      pass "d. $1: the agent exits $rc with every worker's process gone" ||
      fail "d. $1: exit $rc (want $3), left behind: $left"
  else fail "d. $1: workers did not record their processes"; kill -KILL $apid; fi
done

# e. a restart: attempt 0's processes (its workers exit 3) are gone while attempt 1 runs.
start_agent e fail0 --max-restarts 1
if recorded "$T/e.pids0" 2 && snapshot "$T/e.pids0" && recorded "$T/e.pids1" 2; then
  snapshot "$T/e.pids1"
  left="$(survivors "$T/e.pids0")"
  [ -z "$left" ] && pass "e. attempt 0's processes are gone while attempt 1 runs" ||
    fail "e. attempt 0's processes alive in attempt 1: $left"
  touch "$GO"
  for _ in $(seq 300); do kill -0 $apid 2>/dev/null || break; sleep 0.05; done
  kill -KILL $apid 2>/dev/null; wait $apid; rc=$?
  left="$(survivors "$T/e.pids1")"
  [ $rc -eq 0 ] && [ -z "$left" ] && pass "e. attempt 1 succeeded, its processes gone at exit" ||
    fail "e. attempt 1: exit $rc, left behind: $left"
else fail "e. workers did not record their processes: $(cat "$T"/e.pids* 2>/dev/null | tr '\n' ' ')"; kill -KILL $apid; fi

# f. as PID 1 of a pid namespace, killed with -9 from outside.
if [ "$(id -u)" = 0 ] && unshare --pid --fork --mount-proc true 2>/dev/null; then
  export PIDS="$T/f.pids" MODE=wait GO="$T/f.go"
  unshare --pid --fork --mount-proc "$AGENT" --http-port -1 --monitor-interval 0.05 --standalone \
    --nproc-per-node 2 -- bash "$T/worker.sh" >/dev/null 2>"$T/f.err" &
  upid=$!
  if recorded "$T/f.pids0" 2; then
    a1="$(pgrep -P $upid)"
    ns="$(readlink "/proc/$a1/ns/pid")"
    in_ns() { local p; for p in /proc/[0-9]*; do [ "$(readlink "$p/ns/pid" 2>/dev/null)" = "$ns" ] && echo -n "${p#/proc/} "; done; }
    n0="$(in_ns | wc -w)"
    kill -KILL "$a1"; wait $upid
    left="$n0"
    for _ in $(seq 200); do left="$(in_ns)"; [ -z "$left" ] && break; sleep 0.05; done
    [ -n "$ns" ] && [ "$n0" -ge 9 ] && [ -z "$left" ] &&
      pass "f. as PID 1, kill -9 from outside: none of the $n0 processes of its namespace is left" ||
      fail "f. as PID 1: namespace '$ns' had $n0 processes, left: $left"
  else fail "f. workers did not record their processes"; kill -KILL $upid; fi
else
  test_skip "f. needs root and unshare --pid (PID 1 case)" || fails=$((fails + 1))
fi

agent_test_end orphans_test
