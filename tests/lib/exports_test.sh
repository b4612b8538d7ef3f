#!/usr/bin/env bash
# libtdist.so exports the public API (every TDIST_EXTERN function of include/tdist/*.h) and
# nothing else: no internal tdist__ symbols, no stray globals.
set -euo pipefail
so="$1"
shift
syms="$(nm -D --defined-only "$so" | awk '{print $3}' | sort)"
bad="$(grep -vE '^(tdist_[a-z0-9_]+|__bss_start|_edata|_end)$' <<<"$syms" || true)"
if [ -n "$bad" ]; then
  echo "FAIL: libtdist.so exports non-public symbols:"; echo "$bad"; exit 1
fi
want="$(cat "$@" | tr -s ' \n' ' ' | grep -oE 'TDIST_EXTERN [^;{]*\(' | grep -oE 'tdist_[a-z0-9_]+ *\($' | tr -d ' (' | sort -u)"
missing="$(comm -23 <(echo "$want") <(echo "$syms"))"
if [ -n "$missing" ]; then
  echo "FAIL: declared in the headers but not exported:"; echo "$missing"; exit 1
fi
echo "ok: $(wc -l <<<"$want") public functions exported, nothing else"
