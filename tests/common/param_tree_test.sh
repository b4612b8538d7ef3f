#!/bin/bash
# Every TDIST_* variable of the tree is in a parameter table (libtdist's runtime/common/param.h or
# the agent's operator-agent/common/param.h), and docs/environment.md's list is the one
# //tests/common:param_doc generates from them.
#   $1 param_doc  $2 param_tree_check.py  $3 docs/environment.md
# The source tree is scanned where it really is (environment.md's runfile resolved), so that a
# package added later is scanned without a BUILD change; the test is tagged external (never cached).
# First the checker must catch variables planted in a scratch copy, then pass on the tree.
set -u
doc=$1 check=$2 envdoc=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
root=$(dirname "$(dirname "$(readlink -f "$envdoc")")")
[ -f "$root/runtime/common/param.c" ] || fail "no checkout at $root (from $envdoc)"
"$doc" --names >"$tmp/names" || fail "param_doc --names"
[ "$(wc -l <"$tmp/names")" -gt 20 ] || fail "param_doc --names listed too few names"

# The checker catches what is planted: a literal name, one split over adjacent literals, a name
# built at run time, a getenv of a variable, and a table row nothing reads.
mktree() { # $1: the planted file's body
  rm -rf "$tmp/tree" && mkdir -p "$tmp/tree/runtime/common" "$tmp/tree/runtime/x"
  mkdir -p "$tmp/tree/operator-agent/common"
  cp "$root/runtime/common/param.c" "$root/runtime/common/param.h" "$tmp/tree/runtime/common/"
  cp "$root/operator-agent/common/param.c" "$root/operator-agent/common/param.h" \
    "$tmp/tree/operator-agent/common/"
  # every row of both tables used once, so that only the planted problem is found
  { sed -n 's/^ *X(\([A-Z0-9_]*\),.*/int use_\1 = TDIST__P_\1;/p' "$root/runtime/common/param.h"
    sed -n 's/^ *X(\([A-Z0-9_]*\),.*/int agent_use_\1 = AGENT_P_\1;/p' \
      "$root/operator-agent/common/param.h"; } >"$tmp/tree/runtime/x/uses.c"
  printf '%s\n' "$1" >"$tmp/tree/runtime/x/planted.c"
}
plant() { # $1 file body, $2 the finding expected
  mktree "$1"
  if python3 "$check" "$tmp/tree" "$tmp/names" >"$tmp/out" 2>&1; then
    cat "$tmp/out"
    fail "the checker passed a tree with: $1"
  fi
  grep -q -- "$2" "$tmp/out" || { cat "$tmp/out"; fail "no '$2' finding for: $1"; }
  echo "caught: $1"
}
plant 'const char *v = getenv("TDIST_PLANTED_VAR");' 'planted.c:1: TDIST_PLANTED_VAR is read'
plant 'static const char *k = "TDIST_" "SPLIT_VAR"; /* getenv(k) */' 'TDIST_SPLIT_VAR is read'
plant 'void f(char *b) { snprintf(b, 64, "TDIST_%s", "X"); }' 'builds a TDIST_\* name'
plant 'const char *f(const char *n) { return secure_getenv(n); }' 'getenv(n) reads a variable'
mktree '/* getenv("TDIST_IN_A_COMMENT") */ const char *v = getenv("TDIST_SHM");'
python3 "$check" "$tmp/tree" "$tmp/names" || fail "a comment or a known name was a finding"
sed -i '/use_SHM_YIELD/d' "$tmp/tree/runtime/x/uses.c"
python3 "$check" "$tmp/tree" "$tmp/names" >"$tmp/out" 2>&1 && fail "an unread row passed"
grep -q 'TDIST_SHM_YIELD is in the table but nothing reads it' "$tmp/out" || fail "unread row"
mktree '/* nothing */'
sed -i '/agent_use_PYTHON/d' "$tmp/tree/runtime/x/uses.c"
python3 "$check" "$tmp/tree" "$tmp/names" >"$tmp/out" 2>&1 && fail "an unread agent row passed"
grep -q 'operator-agent/common/param.h: TDIST_PYTHON is in the table but nothing reads it' \
  "$tmp/out" || { cat "$tmp/out"; fail "unread agent row"; }
echo "caught: unread rows of both tables"

# The tree itself.
python3 "$check" "$root" "$tmp/names" || fail "the tree reads TDIST_* variables the table lacks"

# docs/environment.md's section is the generated one.
"$doc" >"$tmp/section.md" || fail "param_doc"
sed -n '/^<!-- BEGIN TDIST_\* variables/,/^<!-- END TDIST_\* variables -->/p' "$envdoc" \
  >"$tmp/doc_section.md"
[ -s "$tmp/doc_section.md" ] || fail "docs/environment.md has no generated TDIST_* section"
diff -u "$tmp/section.md" "$tmp/doc_section.md" ||
  fail "docs/environment.md's TDIST_* list is stale: bazel run //tests/common:param_doc and paste it in"
echo "ok: tree and docs/environment.md match the table ($(wc -l <"$tmp/names") names)"
