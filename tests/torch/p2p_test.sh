#!/usr/bin/env bash
# Point-to-point on the "tdist" PyTorch backend in any posting order ($TDIST_TORCH: 1.13 or 2.6,
# see tests/testlib/torch.sh): PyTorch's batch_isend_irecv pattern with every irecv before its
# isend (issue 32: 32 bytes deadlocked), tags, several in flight, blocking send/recv, 3 ranks
# (tests/torch/p2p_check.py says what each check is).
#   args: LIBTDIST_SO PACKAGE_INIT_PY CHECK_PY
set -uo pipefail
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
. "$LIB/torch.sh"
exec 9>&2
export TDIST_LIBRARY="$(realpath "$1")"
export PYTHONPATH="$(dirname "$(dirname "$(realpath "$2")")")"
bounded 260 "$PY" -u "$(realpath "$3")" 3
rc=$?
[ $rc -eq 0 ] && echo "PASS: tdist p2p on PyTorch $TORCH_VERSION" || echo "FAIL: p2p_check exited $rc"
exit $rc
