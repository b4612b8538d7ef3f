#!/bin/bash
# tdist-agent and its TDIST_* parameters (runtime/common/param.h), on the real binary: a bad value
# stops it at start-up with exit status 64 and a message naming the variable, the value and what
# is allowed; a good TDIST_PYTHON is the interpreter a .py worker command runs with.
#   $1 tdist-agent
set -u
agent=$(readlink -f "$1")
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
