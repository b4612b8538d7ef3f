#!/usr/bin/env bash
# Run directories and start-up errors of tdist-agent (issue 14, items 7 and 8), real processes:
#   a. a symlink planted where the old name tdist-<run_id>_<pid> would be (the pid is known: the
#      agent is exec'd from a subshell) is not followed: its target stays empty;
#   b. a directory planted there owned by another uid (root only) gets nothing written into it;
#   c. the run directory is mode 0700 and removed at exit: on success, on a worker failure, on
#      SIGTERM, with a symlink to an outside file left inside by a worker (the file survives);
#   d. --keep-run-dir keeps it;
#   e. a missing --log-dir is created; an unusable --log-dir / TMPDIR exits 64 naming the path and errno; a bad --http-host exits
#      64 naming --http-host; --check-config rejects --master-template '{nope}' (64).
#   args: AGENT
set -uo pipefail
AGENT="$(realpath "$1")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/rundir.$$"; mkdir -p "$T"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
run_agent() { # LOGDIR ERRFILE ARGS... -> exit code
  local d="$1" e="$2"; shift 2
  TDIST_LOG_LEVEL=info bounded 60 "$AGENT" --http-port -1 --standalone --log-dir "$d" "$@" 2>"$e"
}
leftovers() { find "$1" -mindepth 1 -maxdepth 1 -name 'tdist-*' | wc -l; }

# a. planted symlink at the old predictable name
mkdir -p "$T/a" "$T/a-target"
(
  ln -s "$T/a-target" "$T/a/tdist-rid_$BASHPID"
  exec "$AGENT" --http-port -1 --standalone --run-id rid --log-dir "$T/a" -- true 2>"$T/a.err"
)
rc=$?
if [ -z "$(ls -A "$T/a-target")" ] && [ "$rc" = 0 ]; then pass "a. planted symlink not followed"
else fail "a. planted symlink followed (rc $rc): $(ls -A "$T/a-target" | head -3)"; fi

# b. planted directory owned by another uid
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$T/b"
  (
    mkdir "$T/b/tdist-rid_$BASHPID" && chown 65534:65534 "$T/b/tdist-rid_$BASHPID"
    echo "$T/b/tdist-rid_$BASHPID" >"$T/b.planted"
    exec "$AGENT" --http-port -1 --standalone --run-id rid --log-dir "$T/b" -- true 2>"$T/b.err"
  )
  rc=$?
  p="$(cat "$T/b.planted")"
  if [ -z "$(ls -A "$p")" ] && [ "$rc" = 0 ]; then pass "b. foreign directory left untouched"
  else fail "b. wrote into a directory of uid 65534 (rc $rc): $(ls -A "$p" | head -3)"; fi
else
  fail "b. needs root to plant a directory of another uid (uid $(id -u))"
fi

# c. mode 0700, removed at exit: success, failure, SIGTERM, a link left inside
mkdir -p "$T/c1" "$T/c2" "$T/c3" "$T/c4"
run_agent "$T/c1" "$T/c1.err" -- sh -c 'stat -c %a "$(dirname "$(dirname "$(dirname \
  "$TORCHELASTIC_ERROR_FILE")")")" >'"$T/c1.mode"
rc=$?
[ "$rc" = 0 ] && [ "$(cat "$T/c1.mode")" = 700 ] && [ "$(leftovers "$T/c1")" = 0 ] &&
  pass "c. success: mode 0700, removed" ||
  fail "c. success: rc $rc, mode $(cat "$T/c1.mode"), $(leftovers "$T/c1") left"
run_agent "$T/c2" "$T/c2.err" -- sh -c 'exit 3'
rc=$?
# A failed worker makes the agent dump the flight recorders there: then it is kept, and logged.
[ "$rc" = 3 ] && [ "$(leftovers "$T/c2")" = 1 ] && ls "$T"/c2/tdist-*/flight-node0-*.json \
  >/dev/null && grep -q "keeping the run directory $T/c2/tdist-.*flight-recorder dump" \
  "$T/c2.err" && pass "c. worker failure (exit 3): kept with its flight dump, logged" ||
  fail "c. worker failure: rc $rc, $(leftovers "$T/c2") present"
rm -rf "$T"/c2/tdist-*
TDIST_LOG_LEVEL=info "$AGENT" --http-port -1 --standalone --log-dir "$T/c3" -- sleep 100 \
  2>"$T/c3.err" &
ap=$!
for _ in $(seq 100); do [ "$(leftovers "$T/c3")" = 1 ] && break; sleep 0.1; done
sleep 0.5
kill -TERM "$ap"
wait "$ap"
rc=$?
[ "$rc" = 143 ] && [ "$(leftovers "$T/c3")" = 0 ] && pass "c. SIGTERM (143): removed" ||
  fail "c. SIGTERM: rc $rc, $(leftovers "$T/c3") left"
echo precious >"$T/outside"
mkdir -p "$T/outdir" && echo keep >"$T/outdir/f"
run_agent "$T/c4" "$T/c4.err" -- sh -c 'd=$(dirname "$TORCHELASTIC_ERROR_FILE"); \
  ln -s '"$T/outside"' "$d/l"; ln -s '"$T/outdir"' "$d/ld"; mkdir -p "$d/x/y/z"; echo 1 >"$d/x/y/z/f"'
rc=$?
[ "$rc" = 0 ] && [ "$(leftovers "$T/c4")" = 0 ] && [ "$(cat "$T/outside")" = precious ] &&
  [ -f "$T/outdir/f" ] && pass "c. links and subdirectories inside: removed, targets intact" ||
  fail "c. links inside: rc $rc, $(leftovers "$T/c4") left, outside: $(ls "$T/outdir")"

# d. --keep-run-dir
mkdir -p "$T/d"
run_agent "$T/d" "$T/d.err" --keep-run-dir -- true
rc=$?
[ "$rc" = 0 ] && [ "$(leftovers "$T/d")" = 1 ] && pass "d. --keep-run-dir keeps it" ||
  fail "d. --keep-run-dir: rc $rc, $(leftovers "$T/d") present"

# e. start-up errors: exit code and wording
expect() { # NAME WANT_RC PATTERN ERRFILE RC
  if [ "$5" = "$2" ] && grep -q -- "$3" "$4"; then pass "e. $1: exit $5, '$3'"
  else fail "e. $1: exit $5 (want $2), stderr: $(grep -v ' I ' "$4" | tail -2)"; fi
}
echo x >"$T/file"
run_agent "$T/file/sub" "$T/e1.err" -- true
expect "--log-dir under a file" 64 "$T/file/sub: Not a directory" "$T/e1.err" $?
run_agent "$T/new/er" "$T/e0.err" -- true
rc=$?
[ "$rc" = 0 ] && [ -d "$T/new/er" ] && [ "$(leftovers "$T/new/er")" = 0 ] &&
  pass "a missing --log-dir is created (mkdir -p)" || fail "missing --log-dir: rc $rc"
(unset PET_LOG_DIR; TMPDIR="$T/file" TDIST_LOG_LEVEL=info bounded 60 "$AGENT" --http-port -1 \
  --standalone -- true 2>"$T/e2.err")
expect "TMPDIR a file" 64 "$T/file: Not a directory" "$T/e2.err" $?
if [ "$(id -u)" != 0 ]; then
  mkdir -p "$T/ro" && chmod 500 "$T/ro"
  run_agent "$T/ro" "$T/e3.err" -- true
  expect "read-only --log-dir" 64 "Permission denied" "$T/e3.err" $?
fi
run_agent "$T" "$T/e4.err" --http-host nope.example --http-port 0 -- true
expect "bad --http-host" 64 "--http-host 'nope.example' is not an IP address" "$T/e4.err" $?
"$AGENT" --check-config --nnodes 2 --node-rank 1 --master-template '{nope}' >/dev/null \
  2>"$T/e5.err"
expect "--check-config --master-template '{nope}'" 64 "unknown placeholder '{nope}'" \
  "$T/e5.err" $?
"$AGENT" --check-config --standalone --http-host bad >/dev/null 2>"$T/e6.err"
expect "--check-config --http-host bad" 64 "--http-host 'bad'" "$T/e6.err" $?

[ "$fails" = 0 ] && echo "rundir_test: all passed" || echo "rundir_test: $fails failed"
[ "$fails" = 0 ]
