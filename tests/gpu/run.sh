#!/usr/bin/env bash
# GPU check of the nccl backend, for a machine with at least one NVIDIA GPU, the driver, the CUDA
# runtime and NCCL (>= 2.14). Builds //tests/gpu:nccl_gpu_test with -c opt (plain cc when bazel is
# missing), runs it and prints its tables: correctness of every collective x dtype x op at world
# size 1 against a CPU reference, all_reduce timing 8 B ... 1 GiB against a plain NCCL loop, and
# an init timeout with an absent rank; then the C training example (examples/train) on the GPU
# with --backend nccl, the gpu-nccl overlay's workload, as one rank. Exit status: the check
# program's (1 = a check failed, 2 = it could not run), else 1 if the example failed; timings
# never fail it. Keeps under 5 minutes: the build gets 240 s, the run
# TDIST_GPU_RUN_S (default 200 s). Extra arguments go to the program (--max-bytes N,
# --budget-ms N, --big-count N, --no-bench, --no-fault). Device: TDIST_NCCL_DEVICE (default 0).
# TDIST_GPU_BUILD=cc skips bazel and compiles the sources with ${CC:-cc} directly.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
say() { echo "[run.sh +$(( $(date +%s) - t0 ))s] $*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >&2 || true
else
  say "nvidia-smi not found (no NVIDIA driver?): the program will say what is missing"
fi

bin="" train=""
if [ "${TDIST_GPU_BUILD:-bazel}" = bazel ] && command -v bazel >/dev/null 2>&1; then
  say "bazel build -c opt //tests/gpu:nccl_gpu_test //examples/train:train"
  if timeout 240 bazel build -c opt //tests/gpu:nccl_gpu_test //examples/train:train >&2; then
    bin="bazel-bin/tests/gpu/nccl_gpu_test" train="bazel-bin/examples/train/train"
  else
    say "bazel build failed; trying a plain cc build"
  fi
fi
if [ -z "$bin" ]; then
  cuda="${CUDA_HOME:-/usr/local/cuda}"
  out="${TMPDIR:-/tmp}/tdist-gpu-check"
  mkdir -p "$out"
  srcs=$(ls envparam/*.c runtime/common/*.c runtime/store/*.c runtime/pg/*.c runtime/gloo/*.c \
           runtime/gloo/*/*.c runtime/nccl/*.c | grep -v tdist_store_main.c)
  say "cc -O2 (${cuda}/include) -> $out/nccl_gpu_test"
  # shellcheck disable=SC2086
  if ! timeout 240 "${CC:-cc}" -std=gnu11 -O2 -pthread -D_GNU_SOURCE -I. -Iinclude \
      -isystem "$cuda/include" $srcs tests/gpu/nccl_gpu_test.c -o "$out/nccl_gpu_test" \
      -ldl -lm -lrt; then
    say "build failed"
    exit 2
  fi
  bin="$out/nccl_gpu_test"
  # shellcheck disable=SC2086
  timeout 120 "${CC:-cc}" -std=gnu11 -O2 -pthread -D_GNU_SOURCE -I. -Iinclude \
    -isystem "$cuda/include" $srcs examples/train/train.c -o "$out/train" -ldl -lm -lrt &&
    train="$out/train"
fi

say "running $bin $*"
timeout "${TDIST_GPU_RUN_S:-200}" "$bin" "$@"
rc=$?
[ $rc -eq 124 ] && say "the program ran past ${TDIST_GPU_RUN_S:-200} s and was stopped"
say "exit status $rc"

if [ -n "$train" ]; then
  port=$(( 20000 + RANDOM % 20000 ))
  say "examples/train --backend nccl, 1 rank on device ${TDIST_NCCL_DEVICE:-0} (port $port)"
  if RANK=0 WORLD_SIZE=1 LOCAL_RANK="${TDIST_NCCL_DEVICE:-0}" MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port timeout 60 "$train" --backend nccl --steps 300 --print-every 100; then
    say "examples/train on nccl: ok"
  else
    say "examples/train on nccl FAILED"
    [ $rc -eq 0 ] && rc=1
  fi
else
  say "examples/train was not built: skipped"
fi
exit $rc
