#!/usr/bin/env bash
# PyTorch on the "tdist" backend (runtime/torch/tdist_torch) against PyTorch's own gloo, under
# PyTorch 1.13 (/usr/bin/python3, Debian 12) and 2.6 (the Debian 13 root .ci/setup builds), in
# one run:
#   - all_reduce latency per call from Python, 8 B to 64 MiB, tdist (its C++ group, built here
#     for each version) and its Python group alone against torch gloo, and the C API on the same
#     libtdist group called directly (the difference is what the binding adds);
#   - DDP step time on CPU, steps back to back, for a tiny, a small and a wider MLP and a small
#     conv net, with the step's compute alone, the step with an all_reduce that costs nothing,
#     and the floor no backend can go under.
# 1 (the per-call cost alone), 2 and 4 ranks, tdist over loopback TCP (TDIST_SHM=0) and shared memory (torch gloo is TCP).
#
#   bash bench/torch/run.sh [--versions 1.13,2.6] [bench.py options: --ranks 1,2,4
#        --transports tcp,shm --sizes 8,1K,64K,1M,16M,64M --seconds 0.3 --ddp-steps 20 --skip-ddp]
#
# Prints the tables; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
versions=1.13,2.6
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --versions) versions=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    --skip-ddp) args+=("$1"); shift ;;
    --ranks|--transports|--sizes|--seconds|--ddp-steps) args+=("$1" "$2"); shift 2 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# libtdist, and tdist_torch's C++ group for each version asked for (//runtime/torch:tdist_c_*).
exts=()
IFS=, read -ra vs <<<"$versions"
for v in "${vs[@]}"; do
  case "$v" in
    1.13) exts+=(//runtime/torch:tdist_c_torch113) ;;
    2.6) exts+=(//runtime/torch:tdist_c_torch26) ;;
    *) echo "run.sh: --versions: $v is not 1.13 or 2.6" >&2; exit 2 ;;
  esac
done
bazel build -c opt --color=no --curses=no //runtime:libtdist.so "${exts[@]}" </dev/null >&2
# The bazel-bin symlink follows whichever configuration built last in this shared workspace.
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
export TDIST_LIBRARY="$bin/runtime/libtdist.so" TDIST_TORCH_IMPL=cpp
export PYTHONPATH="$PWD/runtime/torch${PYTHONPATH:+:$PYTHONPATH}"
echo "libtdist: $TDIST_LIBRARY; $(nproc) CPUs; $(date -u +%FT%TZ)"
for v in "${vs[@]}"; do
  case "$v" in
    1.13) py=/usr/bin/python3; export TDIST_TORCH_EXT="$bin/runtime/torch/tdist_c_torch113.so" ;;
    2.6) py="$PWD/tests/testlib/torch26/python3"; export TDIST_TORCH_EXT="$bin/runtime/torch/tdist_c_torch26.so" ;;
  esac
  echo
  echo "######## PyTorch $v"
  "$py" -u bench/torch/bench.py "${args[@]}"
done
