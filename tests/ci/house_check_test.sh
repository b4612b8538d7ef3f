#!/usr/bin/env bash
# .ci/house_check on two fixture trees made here: one that breaks each of its rules once (a file
# over 1,000 lines, a C and a Python function over 150 lines in runtime/ and operator-agent/, an
# agent file that includes a runtime/ header, a backend that includes runtime/pg/group.h, an
# include cycle between two folders, two product packages whose BUILD files name each other) must
# fail and name every offender, and nothing else; one that keeps every rule at its limit (1,000
# lines, 150-line functions, the allowed includes, a folder including its parent without a way
# back, packages that name each other only in visibility or load(), test packages sharing data)
# must pass.
#   args: HOUSE_CHECK
set -euo pipefail

check="$1"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/house.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# lines N: N numbered comment lines.
lines() { seq 1 "$1" | sed 's/^/# line /'; }

# c_function NAME SPAN: a C function whose end line minus its start line is SPAN (>= 4).
c_function() {
  echo "int $1(void) {"
  echo "  int x = 0;"
  seq 4 "$2" | sed 's/.*/  x++;/'
  echo "  return x;"
  echo "}"
}

# py_function NAME SPAN: a Python function whose end line minus its start line is SPAN.
py_function() {
  echo "def $1():"
  echo "    x = 0"
  seq 2 "$2" | sed 's/.*/    x += 1/'
}

# put PATH: writes stdin to ROOT/PATH.
put() { mkdir -p "$(dirname "$1")"; cat >"$1"; }

make_broken() {
  local r="$1"
  lines 1001 | put "$r/tests/big_test.sh"
  c_function long_c 151 | put "$r/runtime/common/long.c"
  py_function long_py 151 | put "$r/operator-agent/tools/long.py"
  printf '#include "runtime/common/param.h"\n' | put "$r/operator-agent/main.c"
  printf 'int param;\n' | put "$r/runtime/common/param.h"
  printf '#include "runtime/pg/group.h"\n' | put "$r/runtime/gloo/gloo.c"
  printf 'struct tdist_pg_s;\n' | put "$r/runtime/pg/group.h"
  printf '#include "runtime/b/b.h"\n' | put "$r/runtime/a/a.h"
  printf '#include "runtime/a/a.h"\n' | put "$r/runtime/b/b.c"
  printf 'int b;\n' | put "$r/runtime/b/b.h"
  printf 'cc_library(name = "c", deps = ["//runtime/d:d"])\n' | put "$r/runtime/c/BUILD"
  printf 'cc_library(name = "d", deps = ["//runtime/c"])  # names //runtime/x\n' | put "$r/runtime/d/BUILD"
}

make_clean() {
  local r="$1"
  lines 1000 | put "$r/tests/big_test.sh"
  lines 1500 | put "$r/docs/notes.md"  # not a source file
  c_function long_c 150 | put "$r/runtime/common/long.c"
  c_function long_tool 400 | put "$r/bench/tool.c"  # functions are counted in runtime/ and operator-agent/ only
  py_function long_py 150 | put "$r/operator-agent/tools/long.py"
  printf '#include "tdist/store.h"\n#include "operator-agent/common/log.h"\n' | put "$r/operator-agent/main.c"
  printf 'int log;\n' | put "$r/operator-agent/common/log.h"
  printf 'int store;\n' | put "$r/include/tdist/store.h"
  printf '#include "runtime/pg/group.h"\n#include "tdist/store.h"\n' | put "$r/runtime/pg/pg.c"
  printf 'struct tdist_pg_s;\n' | put "$r/runtime/pg/group.h"
  printf '#include "runtime/gloo/transport.h"\n' | put "$r/runtime/gloo/tcp/tcp.c"
  printf 'int t;\n' | put "$r/runtime/gloo/transport.h"
  printf 'load("//runtime/d:defs.bzl", "X")\ncc_library(name = "c", deps = ["//runtime/d:d"])\n' \
    | put "$r/runtime/c/BUILD"
  printf 'package(default_visibility = ["//runtime/c:__pkg__", "//runtime:__subpackages__"])\ncc_library(name = "d")\n' \
    | put "$r/runtime/d/BUILD"
  printf 'sh_test(name = "a", data = ["//tests/b:x.sh"])\n' | put "$r/tests/a/BUILD"
  printf 'sh_test(name = "b", data = ["//tests/a:y.sh"])\n' | put "$r/tests/b/BUILD"
}

expect_line() {
  grep -qF -- "$1" "$tmp/out" || { echo "FAIL: no line with '$1' in:"; cat "$tmp/out"; exit 1; }
}

make_broken "$tmp/broken"
rc=0
python3 "$check" "$tmp/broken" >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: the broken tree: exit $rc, want 1"; cat "$tmp/out" "$tmp/err"; exit 1; }
expect_line "house_check: files: tests/big_test.sh has 1001 lines"
expect_line "house_check: functions: runtime/common/long.c:1 long_c is 151 lines"
expect_line "house_check: functions: operator-agent/tools/long.py:1 long_py is 151 lines"
expect_line "house_check: agent: operator-agent/main.c includes runtime/common/param.h"
expect_line "house_check: pg: runtime/gloo/gloo.c includes runtime/pg/group.h"
expect_line "house_check: cycles: runtime/a -> runtime/b -> runtime/a (runtime/a/a.h includes runtime/b/b.h; runtime/b/b.c includes runtime/a/a.h)"
expect_line "house_check: packages: //runtime/c -> //runtime/d -> //runtime/c (//runtime/c names //runtime/d:d; //runtime/d names //runtime/c)"
n="$(grep -c '^house_check: ' "$tmp/out")"
[ "$n" -eq 7 ] || { echo "FAIL: $n offenders listed, want 7:"; cat "$tmp/out"; exit 1; }
grep -qF "7 offender(s)" "$tmp/err" || { echo "FAIL: no count on stderr:"; cat "$tmp/err"; exit 1; }
echo "ok: the broken tree fails with its 7 offenders"

make_clean "$tmp/clean"
rc=0
python3 "$check" "$tmp/clean" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: the clean tree: exit $rc, want 0"; cat "$tmp/out"; exit 1; }
expect_line "no file over 1000 lines, no function over 150"
echo "ok: the clean tree passes"
