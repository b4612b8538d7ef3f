#!/bin/bash
# Every relative link in README.md and docs/*.md resolves to a file of the tree, and every
# #anchor to a heading of its Markdown file (link_check.py). The files are read where they really
# are (README.md's runfile resolved), so a page added to docs/ is checked without a BUILD change;
# the test is tagged external (never cached). First the checker must catch broken links planted
# in a scratch tree, and pass what is well formed there, then it checks the tree.
#   $1 link_check.py  $2 README.md
set -euo pipefail

fail() {
  echo "FAIL: $*"
  exit 1
}

# plant FILE_BODY FINDING: a scratch tree whose docs/page.md is FILE_BODY must fail with FINDING.
plant() {
  local body=$1 finding=$2
  mktree "$body"
  if python3 "$check" "$tmp/tree" README.md docs/page.md >"$tmp/out" 2>&1; then
    cat "$tmp/out"
    fail "the checker passed: $body"
  fi
  grep -qF -- "$finding" "$tmp/out" || {
    cat "$tmp/out"
    fail "no '$finding' finding for: $body"
  }
  echo "caught: $finding"
}

# mktree PAGE_BODY: README.md links to docs/page.md, which has PAGE_BODY.
mktree() {
  rm -rf "$tmp/tree"
  mkdir -p "$tmp/tree/docs" "$tmp/tree/k8s/base"
  printf '# Top\n\nSee [the page](docs/page.md#a-heading-with-code-and-quotes).\n' \
    >"$tmp/tree/README.md"
  printf '## A heading with `code` and "quotes"\n\n%s\n' "$1" >"$tmp/tree/docs/page.md"
}

main() {
  check=$1
  local readme=$2 root
  tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/links.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  root=$(dirname "$(readlink -f "$readme")")
  [ -d "$root/docs" ] || fail "no docs/ beside $readme (resolved to $root)"

  plant 'A [missing file](nothere.md).' "docs/page.md:3: link 'nothere.md': no file docs/nothere.md"
  plant 'A [bad anchor](../README.md#no-such-heading).' 'no heading with anchor #no-such-heading in README.md'
  plant 'Same page: [x](#nope).' 'no heading with anchor #nope in docs/page.md'
  plant 'Out: [x](../../etc/passwd).' 'leaves the tree'
  mktree 'Fine: [up](../k8s/base), [self](#a-heading-with-code-and-quotes), [web](https://example.com/x),
`[in code](nowhere.md)`, and

    [indented code](nowhere.md)

```
[fenced](nowhere.md)
```'
  python3 "$check" "$tmp/tree" README.md docs/page.md ||
    fail "a well-formed page, or links in code, were findings"

  local files=(README.md)
  local f
  for f in "$root"/docs/*.md; do files+=("docs/${f##*/}"); done
  [ "${#files[@]}" -gt 5 ] || fail "too few pages in $root/docs: ${files[*]}"
  python3 "$check" "$root" "${files[@]}" || fail "broken links in README.md or docs/ (above)"
}

main "$@"
