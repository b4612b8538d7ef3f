#!/usr/bin/env bash
# libtdist.so exports the public API (every TDIST_EXTERN function of include/tdist/*.h) and
# nothing else: no internal tdist__ symbols, no stray globals, no tdist_ function the headers do
# not declare. Fails when there is nothing to compare: no header given, a header missing, no
# declaration found, or nothing exported.
#   args: LIBTDIST_SO HEADER...
set -euo pipefail
so="$1"
shift
[ $# -gt 0 ] || { echo "FAIL: no header files given"; exit 1; }
for h in "$@"; do [ -s "$h" ] || { echo "FAIL: header '$h' missing or empty"; exit 1; }; done
syms="$(nm -D --defined-only "$so" | awk '{print $3}' | sort)"
[ -n "$syms" ] || { echo "FAIL: $so exports nothing"; exit 1; }
bad="$(grep -vE '^(tdist_[a-z0-9_]+|__bss_start|_edata|_end)$' <<<"$syms" || true)"
if [ -n "$bad" ]; then
  echo "FAIL: libtdist.so exports non-public symbols:"; echo "$bad"; exit 1
fi
want="$(cat "$@" | tr -s ' \n' ' ' | grep -oE 'TDIST_EXTERN [^;{]*\(' | grep -oE 'tdist_[a-z0-9_]+ *\($' | tr -d ' (' | sort -u || true)"
[ -n "$want" ] || { echo "FAIL: no TDIST_EXTERN declaration found in $*"; exit 1; }
missing="$(comm -23 <(echo "$want") <(echo "$syms"))"
if [ -n "$missing" ]; then
  echo "FAIL: declared in the headers but not exported:"; echo "$missing"; exit 1
fi
extra="$(comm -13 <(echo "$want") <(grep -E '^tdist_' <<<"$syms"))"
if [ -n "$extra" ]; then
  echo "FAIL: exported but declared in no header:"; echo "$extra"; exit 1
fi
echo "ok: $(wc -l <<<"$want") public functions exported, nothing else ($# headers)"
