#!/usr/bin/env bash
# Acceptance test: real PyTorch Python clients drive every TCPStore operation against (a) a
# master server of the same PyTorch, (b) our `tdist-store serve` and (c) that server behind our
# `tdist-store proxy`; the three transcripts must be identical, and each run also checks its answers against the reference on its own. The PyTorch
# is $TDIST_TORCH's (torch_sh_test: the _torch113 and _torch26 variants); with 2.x the clients
# also run the 2.x-only API (check, append, multi_get, multi_set, CANCEL_WAIT after timeouts)
# and raw 2.x requests (torch_client_ops.py).
#
# usage: torch_client_vs_tdist_server_test.sh TDIST_STORE_BIN   (bazel passes $(rootpath ...))
source "$(dirname "${BASH_SOURCE[0]}")/interop_lib.sh"

TDIST_STORE="${1:?usage: $0 path/to/tdist-store}"
[ -x "$TDIST_STORE" ] || interop_fail "tdist-store binary not found or not executable: '$TDIST_STORE'"
interop_pick_seed

# run_against KIND: torch, tdist, or proxy (our server behind our proxy: the clients talk to
# the proxy, as a node's workers talk to their agent's).
run_against() {
  local kind="$1" upstream_pid=""
  if [ "$kind" = proxy ]; then
    interop_start_server tdist "proxied-server" "$TDIST_STORE"
    upstream_pid="$SERVER_PID"
    interop_start_server proxy "proxy" "$TDIST_STORE" "$SERVER_PORT"
  else
    interop_start_server "$kind" "$kind-server" "$TDIST_STORE"
  fi
  local pid="$SERVER_PID" rc=0
  timeout -k 5 110 "$PYTHON" "$INTEROP_DIR/torch_client_ops.py" --port "$SERVER_PORT" \
    --seed "$INTEROP_SEED" --label "$kind" --out "$INTEROP_TMP/transcript.$kind" || rc=$?
  if [ "$rc" != 0 ]; then
    # Keep going: the transcript diff below usually says more than the self-checks.
    interop_dump_logs
    ERRORS+=("PyTorch clients against the $kind server failed (exit $rc)")
  fi
  local src=0 name="$kind-server"
  [ "$kind" = proxy ] && name=proxy
  interop_stop_server "$pid" "$name" || src=$?
  if [ "$src" != 0 ]; then
    interop_fail "$name exited with status $src on SIGTERM (want 0)"
  fi
  if [ -n "$upstream_pid" ]; then
    interop_stop_server "$upstream_pid" "proxied-server" || src=$?
    [ "$src" = 0 ] || interop_fail "the proxied server exited with status $src on SIGTERM (want 0)"
  fi
}

ERRORS=()
run_against torch
run_against tdist
run_against proxy
for kind in tdist proxy; do
  if [ -s "$INTEROP_TMP/transcript.torch" ] && [ -s "$INTEROP_TMP/transcript.$kind" ]; then
    (interop_compare "$INTEROP_TMP/transcript.torch" "$INTEROP_TMP/transcript.$kind" \
      "PyTorch $TORCH_VERSION clients ($kind)") || ERRORS+=("transcripts differ ($kind)")
  else
    ERRORS+=("a transcript is missing ($kind)")
  fi
done
if [ "${#ERRORS[@]}" != 0 ]; then
  interop_fail "$(IFS=';'; echo "${ERRORS[*]}")"
fi
echo "PASS: torch_client_vs_tdist_server_test_$TORCH_TAG (PyTorch $TORCH_VERSION, seed $INTEROP_SEED)"
