#!/usr/bin/env bash
# The nccl backend is loaded with dlopen: libtdist.so and programs linked with libtdist must load
# on nodes without the CUDA driver, runtime or NCCL. Checks that none of the given ELF files has a
# DT_NEEDED entry for libcuda, libcudart or libnccl, and that libtdist.so still mentions the
# libraries it opens at run time (so the check is not vacuous).
set -euo pipefail
so="$1"
status=0
for f in "$@"; do
  needed="$(readelf -d "$f" | awk '/\(NEEDED\)/ {gsub(/[][]/, "", $5); print $5}')"
  bad="$(grep -E '^lib(cuda|cudart|nccl)([.-]|$)' <<<"$needed" || true)"
  if [ -n "$bad" ]; then
    echo "FAIL: $f needs $(tr '\n' ' ' <<<"$bad")at load time"
    status=1
  else
    echo "ok: $f needs only: $(tr '\n' ' ' <<<"$needed")"
  fi
done
for lib in libnccl.so.2 libcudart.so; do
  if ! grep -qa "$lib" "$so"; then
    echo "FAIL: $so does not mention $lib: is the nccl backend linked in?"
    status=1
  fi
done
exit $status
