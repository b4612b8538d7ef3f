#!/usr/bin/env bash
# Runs the GPU check program (nccl_gpu_test) on a CPU machine against the fake CUDA runtime +
# NCCL of //tests/nccl (a fault seam, not a GPU), with small sizes: the correctness sweep, the
# timing loop and the init-timeout check run for real, so the script handed to GPU machines is
# known to work up to the parts only a GPU can tell (numbers, real NCCL behaviour).
set -euo pipefail
prog="$1"
fake="$(realpath "$2")"
export TDIST_CUDART_LIBRARY="$fake" TDIST_NCCL_LIBRARY="$fake" TDIST_NCCL_SPIN_US=200
out="${TEST_TMPDIR:-/tmp}/nccl_gpu_test.out"
"$prog" --max-bytes 4096 --budget-ms 2 --big-count 4099 | tee "$out"
grep -q '^PASS: ' "$out"
grep -q '^ *4 KiB |' "$out"
grep -q 'rank 1 absent: init returned TDIST_ERR_TIMEOUT' "$out"
echo "ok"
