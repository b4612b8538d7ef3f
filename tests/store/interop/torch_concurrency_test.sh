#!/usr/bin/env bash
# Acceptance test: 32 PyTorch client processes (the PyTorch of $TDIST_TORCH: 1.13 or 2.6, one
# torch_sh_test variant each) adding concurrently to a few keys of our `tdist-store serve` (exact
# totals, no lost update), then 32 clients blocked in wait() on one key released by a single set.
# The same script runs first against a real server of that PyTorch, which shows the checks
# themselves hold on the reference.
#
# usage: torch_concurrency_test.sh TDIST_STORE_BIN [WORKERS]
source "$(dirname "${BASH_SOURCE[0]}")/interop_lib.sh"

TDIST_STORE="${1:?usage: $0 path/to/tdist-store [workers]}"
WORKERS="${2:-32}"
[ -x "$TDIST_STORE" ] || interop_fail "tdist-store binary not found or not executable: '$TDIST_STORE'"
interop_pick_seed
# Our server on its default address ("::", dual stack), as PyTorch's listens; the clients connect
# to 127.0.0.1, which PyTorch tries first as the v4-mapped ::ffff:127.0.0.1.
TDIST_SERVE_HOST=""

for kind in torch tdist; do
  interop_start_server "$kind" "$kind-server" "$TDIST_STORE"
  pid="$SERVER_PID"
  mkdir -p "$INTEROP_TMP/work.$kind"
  rc=0
  timeout -k 5 110 "$PYTHON" "$INTEROP_DIR/torch_concurrency.py" --port "$SERVER_PORT" \
    --seed "$INTEROP_SEED" --workers "$WORKERS" --tmp "$INTEROP_TMP/work.$kind" \
    --label "$kind" || rc=$?
  if [ "$rc" != 0 ]; then
    interop_dump_logs
    interop_fail "concurrent PyTorch clients against the $kind server failed (exit $rc)"
  fi
  src=0
  interop_stop_server "$pid" "$kind-server" || src=$?
  [ "$src" = 0 ] || interop_fail "$kind server exited with status $src on SIGTERM (want 0)"
done
echo "PASS: torch_concurrency_test_$TORCH_TAG (PyTorch $TORCH_VERSION, seed $INTEROP_SEED, $WORKERS workers)"
