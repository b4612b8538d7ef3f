#!/bin/bash
# The runtime's layering (tests/pg/layering_check.py): no include or Bazel cycle between the
# folders of runtime/, the group's private header only in runtime/pg, no backend reading the
# group struct. First the checker must catch each of these planted in a scratch tree, then pass
# on the real tree, scanned where it is (README.md's runfile resolved), so a folder added later
# is checked without a BUILD change; tagged external (never cached).
#   $1 layering_check.py  $2 README.md
set -euo pipefail

fail() {
  echo "FAIL: $*"
  exit 1
}

# A scratch tree: runtime/pg with its private header, runtime/gloo, runtime/store.
mktree() {
  rm -rf "$tmp/tree"
  mkdir -p "$tmp/tree/runtime/pg" "$tmp/tree/runtime/gloo" "$tmp/tree/runtime/store"
  printf '#include "runtime/store/store.h"\n' >"$tmp/tree/runtime/pg/group.h"
  printf '#include "runtime/pg/backend.h"\nint f(struct b *b) { return b->rank; }\n' \
    >"$tmp/tree/runtime/gloo/gloo.c"
  printf '/* pg->rank in a comment is fine */\n' >"$tmp/tree/runtime/store/store.h"
  printf 'cc_library(name = "gloo", deps = ["//runtime/pg", "//runtime/store"])\n' \
    >"$tmp/tree/runtime/gloo/BUILD"
}

# $1: what to plant (shell run in the scratch tree), $2: the finding expected.
plant() {
  mktree
  (cd "$tmp/tree" && eval "$1")
  if python3 "$check" "$tmp/tree" >"$tmp/out" 2>&1; then
    cat "$tmp/out"
    fail "the checker passed a tree with: $1"
  fi
  grep -qF -- "$2" "$tmp/out" || {
    cat "$tmp/out"
    fail "no '$2' finding for: $1"
  }
  echo "caught: $1"
}

main() {
  check=$1
  local readme=$2 root
  tmp=${TEST_TMPDIR:-$(mktemp -d)}
  root=$(dirname "$(readlink -f "$readme")")
  [ -f "$root/runtime/pg/backend.h" ] || fail "no checkout at $root (from $readme)"

  mktree
  python3 "$check" "$tmp/tree" >"$tmp/out" 2>&1 || {
    cat "$tmp/out"
    fail "the checker refused the clean scratch tree"
  }
  plant 'printf "#include \"runtime/gloo/transport.h\"\n" >runtime/store/kv.c' \
    'include cycle between folders: store -> gloo -> pg -> store'
  plant 'printf "#include \"runtime/pg/group.h\"\n" >>runtime/gloo/gloo.c' \
    'runtime/gloo/gloo.c:3: includes runtime/pg/group.h, private to runtime/pg/'
  plant 'printf "/* a comment */\nint g(tdist_pg_t *pg) { return pg->size; }\n" >>runtime/gloo/gloo.c' \
    'runtime/gloo/gloo.c:4: a backend reads the group (pg->)'
  plant 'printf "cc_library(name = \"pg\", deps = [\"//runtime/gloo:gloo\"])\n" >runtime/pg/BUILD' \
    'Bazel dependency cycle between packages: //runtime/gloo -> //runtime/pg -> //runtime/gloo'

  python3 "$check" "$root" || fail "the tree's layering has findings (above)"
  echo "PASS"
}

main "$@"
