#!/usr/bin/env bash
# The README's main demo: `bash examples/demo.sh` from the root of a fresh clone (Debian 12, as
# root). Installs the packages of .ci/packages.txt that are missing, builds the C data-parallel
# training example, and trains it with 2 ranks on this machine (env://: rank 0 hosts the store;
# gradients averaged with all_reduce over shared memory). Until tdist-agent exists the ranks are
# started by examples/train/run_local.sh, torchrun-style. Exit status 0 = the job succeeded (loss
# went down and every rank ended with bitwise identical parameters).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash .ci/setup </dev/null
echo "== building //examples/train:train"
bazel build --color=no --curses=no //examples/train:train </dev/null 2>&1 | tail -2
TRAIN_BIN="$(bazel info bazel-bin 2>/dev/null </dev/null)/examples/train/train" \
  exec bash examples/train/run_local.sh "${DEMO_RANKS:-2}" "$@"
