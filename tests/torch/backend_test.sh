#!/usr/bin/env bash
# The "tdist" PyTorch backend (runtime/torch/tdist_torch) under real PyTorch ($TDIST_TORCH: 1.13
# or 2.6, see tests/testlib/torch.sh), 3 ranks of CHECK_PY: backend_check.py (every collective x
# dtype x op against PyTorch's gloo and an independent local reference, refusals, futures, DDP
# against DDP on gloo, and a rank killed with SIGKILL) or debug_check.py (the backend's name,
# TORCH_DISTRIBUTED_DEBUG=DETAIL, gloo's wording of timeouts) or p2p_check.py (point-to-point in
# any posting order); each file says what it checks, rank_launcher.py starts its ranks.
#   args: LIBTDIST_SO PACKAGE_INIT_PY CHECK_PY [BOUND_SECONDS, default 640]
set -uo pipefail
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
. "$LIB/torch.sh"
exec 9>&2
export TDIST_LIBRARY="$(realpath "$1")"
export PYTHONPATH="$(dirname "$(dirname "$(realpath "$2")")")"
bounded "${4:-640}" "$PY" -u "$(realpath "$3")" 3
rc=$?
[ $rc -eq 0 ] && echo "PASS: $(basename "$3") on PyTorch $TORCH_VERSION" || echo "FAIL: $(basename "$3") exited $rc"
exit $rc
