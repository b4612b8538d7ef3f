#!/bin/bash
# tdist-agent, tdist-store and their TDIST_* parameters (runtime/common/param.h), on the real
# binaries: a bad value stops them at start-up (tdist-agent: exit status 64, tdist-store: 2) with
# a message naming the variable, the value and what is allowed; a good TDIST_PYTHON is the
# interpreter a .py worker command runs with.
#   $1 tdist-agent  $2 tdist-store
set -u
agent=$(readlink -f "$1") store=$(readlink -f "$2")
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout -k 5 60 "$agent" --standalone --nproc-per-node 1 --http-port -1 "$@"; }

expect_64() { # $1 VAR=value, $2 message
  env "$1" timeout -k 5 60 "$agent" --standalone --nproc-per-node 1 --http-port -1 -- /bin/true \
    >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 64 ] || { cat "$tmp/err"; fail "$1: exit $rc, wanted 64"; }
  grep -qxF "tdist-agent: error: $2" "$tmp/err" || { cat "$tmp/err"; fail "$1: no '$2'"; }
  echo "ok: ${1%%=*} -> exit 64: $2"
}
expect_64 TDIST_STALL_REPORT_SECONDS=0 \
  "TDIST_STALL_REPORT_SECONDS='0' is not a number in 0.001..86400"
expect_64 TDIST_LOG_LEVEL=loud "TDIST_LOG_LEVEL='loud' is not one of error|warn|warning|info|debug"
expect_64 TDIST_PYTHON="$(printf 'x%.0s' $(seq 4096))" \
  "TDIST_PYTHON='$(printf 'x%.0s' $(seq 64))...' is 4096 bytes long; at most 4095 are allowed"

# TDIST_PYTHON runs "x.py args" as "$TDIST_PYTHON -u x.py args".
printf '#!/bin/sh\necho "$@" >"%s/argv"\n' "$tmp" >"$tmp/fakepy"
chmod +x "$tmp/fakepy"
TDIST_PYTHON="$tmp/fakepy" TDIST_STALL_REPORT_SECONDS=0.5 run -- w.py a b >"$tmp/out" 2>"$tmp/err" ||
  { cat "$tmp/err"; fail "agent with TDIST_PYTHON: exit $?"; }
[ "$(cat "$tmp/argv")" = "-u w.py a b" ] || fail "worker argv: '$(cat "$tmp/argv")'"
echo "ok: TDIST_PYTHON ran the worker as: $tmp/fakepy $(cat "$tmp/argv")"
# TDIST_LOG_LEVEL=debug logs each parameter the agent read.
TDIST_LOG_LEVEL=debug TDIST_PYTHON="$tmp/fakepy" run -- w.py >"$tmp/out" 2>"$tmp/err" ||
  fail "agent at debug: exit $?"
grep -q "param: TDIST_PYTHON=$tmp/fakepy\$" "$tmp/err" || { cat "$tmp/err"; fail "no debug line"; }
echo "ok: debug line for TDIST_PYTHON"

# tdist-store: exit 2 (usage) before doing anything.
TDIST_LOG_LEVEL=chatty timeout -k 5 60 "$store" serve --port 0 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 2 ] || { cat "$tmp/err"; fail "tdist-store with TDIST_LOG_LEVEL=chatty: exit $rc"; }
grep -qxF "tdist-store: TDIST_LOG_LEVEL='chatty' is not one of error|warn|warning|info|debug" \
  "$tmp/err" || { cat "$tmp/err"; fail "tdist-store: no message"; }
echo "ok: tdist-store TDIST_LOG_LEVEL=chatty -> exit 2"
TDIST_LOG_LEVEL=warn timeout -k 5 60 "$store" --version >/dev/null || fail "tdist-store --version"
