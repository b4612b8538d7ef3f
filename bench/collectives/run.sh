#!/usr/bin/env bash
# Collectives benchmark: tdist's gloo backend (loopback TCP and shared memory) against PyTorch 1.13
# gloo and Open MPI (TCP and shared memory), nccl-tests style tables with tdist/peer ratios; and
# tdist's mpi backend on Open MPI against Open MPI itself (column tdist-mpi: ratio and +us).
#
#   bash bench/collectives/run.sh            full run: 2 and 4 ranks, 8 B .. 64 MiB, 2 passes
#                                            (~7 min on 2 cores)
#   bash bench/collectives/run.sh --quick    2 ranks, 5 sizes, fewer iterations (~1-2 min)
#   bash bench/collectives/run.sh --help     every option (--ranks, --colls, --sizes, --repeat...)
#
# Builds coll_bench with `bazel build -c opt`, then builds the Open MPI peer (mpi_peer.c) with
# mpicc into a temporary directory (outside Bazel, so the Bazel build never needs Open MPI). The
# benchmark itself runs from bazel-bin, not under `bazel run`: it must not hold the Bazel lock of
# this shared workspace while it measures. Peers that are missing are skipped with a note:
# PyTorch needs /usr/bin/python3 with torch (python3-torch), Open MPI needs
# `apt-get install -y openmpi-bin libopenmpi-dev`. Arguments go to coll_bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/collectives

if command -v mpicc >/dev/null; then
  # tdist's mpi backend for the tdist-mpi column: libtdist.so and the plugin, -c opt.
  bazel build -c opt --color=no --curses=no //bench/collectives:coll_bench //runtime:libtdist.so \
    //runtime/mpi:libtdist-mpi.so </dev/null
else
  bazel build -c opt --color=no --curses=no //bench/collectives:coll_bench </dev/null
fi
# The bazel-bin symlink follows whichever configuration built last in this shared workspace;
# ask for the -c opt output directory instead.
bin="$(bazel info -c opt bazel-bin 2>/dev/null)/$here/coll_bench"

tmp="$(mktemp -d /tmp/coll_bench_run.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
args=(--torch-peer "$here/torch_peer.py")
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  lib="$(bazel info -c opt bazel-bin 2>/dev/null)/runtime"
  # Linked against libtdist.so: with --tdist it runs the sweep through backend "mpi".
  mpicc -O2 -std=gnu11 -Wall -Wextra -Iinclude -o "$tmp/mpi_peer" "$here/mpi_peer.c" \
    "$here/bench_common.c" "$here/bench_tdist.c" -L"$lib" -ltdist -Wl,-rpath,"$lib"
  export TDIST_MPI_PLUGIN="$lib/mpi/libtdist-mpi.so"
  args+=(--mpi-peer "$tmp/mpi_peer")
else
  echo "run.sh: mpicc/mpirun not found: Open MPI peers skipped" \
       "(apt-get install -y openmpi-bin libopenmpi-dev)" >&2
fi
"$bin" "${args[@]}" "$@"
