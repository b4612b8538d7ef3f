#!/usr/bin/env bash
# Acceptance test: our C client (store_driver, dialect AUTO) runs one scripted session against
# (a) a real PyTorch master server of $TDIST_TORCH's version (torch_sh_test: _torch113 and
# _torch26) and (b) our `tdist-store serve`. The transcripts must be identical; the driver must
# detect V1_13 on PyTorch 1.13, V2 on PyTorch 2.6 and V2 on ours; queue ops must work on ours and
# be refused at once (NOT_AVAILABLE) on PyTorch's servers, which have none; PyTorch clients must
# read back what the C client wrote (and the C client what PyTorch wrote first).
#
# usage: tdist_client_vs_torch_server_test.sh STORE_DRIVER_BIN TDIST_STORE_BIN
source "$(dirname "${BASH_SOURCE[0]}")/interop_lib.sh"

DRIVER="${1:?usage: $0 path/to/store_driver path/to/tdist-store}"
TDIST_STORE="${2:?usage: $0 path/to/store_driver path/to/tdist-store}"
[ -x "$DRIVER" ] || interop_fail "store_driver not found: $DRIVER"
[ -x "$TDIST_STORE" ] || interop_fail "tdist-store binary not found or not executable: '$TDIST_STORE'"
interop_pick_seed

run_against() {
  local kind="$1" dialect="$2" queues="$3"
  interop_start_server "$kind" "$kind-server" "$TDIST_STORE"
  local pid="$SERVER_PID" port="$SERVER_PORT" rc=0
  timeout -k 5 60 "$PYTHON" "$INTEROP_DIR/torch_readback.py" preseed --port "$port" \
    --seed "$INTEROP_SEED" --label "$kind" --manifest-out "$INTEROP_TMP/pre.$kind" || rc=$?
  [ "$rc" = 0 ] || { interop_dump_logs; interop_fail "PyTorch preseed on the $kind server (exit $rc)"; }

  timeout -k 5 60 "$DRIVER" --port "$port" --seed "$INTEROP_SEED" --expect-dialect "$dialect" \
    --expect-queues "$queues" \
    --check-manifest "$INTEROP_TMP/pre.$kind" --manifest-out "$INTEROP_TMP/c.$kind" \
    >"$INTEROP_TMP/transcript.$kind" 2>"$INTEROP_TMP/driver.$kind.err" || rc=$?
  cat "$INTEROP_TMP/driver.$kind.err" >&2
  [ "$rc" = 0 ] || { interop_dump_logs; interop_fail "C driver against the $kind server (exit $rc)"; }

  timeout -k 5 60 "$PYTHON" "$INTEROP_DIR/torch_readback.py" readback --port "$port" \
    --label "$kind" --manifest "$INTEROP_TMP/c.$kind" || rc=$?
  [ "$rc" = 0 ] || { interop_dump_logs; interop_fail "PyTorch readback on the $kind server (exit $rc)"; }

  local src=0
  interop_stop_server "$pid" "$kind-server" || src=$?
  [ "$src" = 0 ] || interop_fail "$kind server exited with status $src on SIGTERM (want 0)"
}

case "$TORCH_MAJOR_MINOR" in
  1.13) run_against torch v1_13 no ;;
  *) run_against torch v2 no ;; # 2.6: VALIDATE + PING accepted; QUEUE_* (post-2.6) unknown
esac
run_against tdist v2 yes
interop_compare "$INTEROP_TMP/transcript.torch" "$INTEROP_TMP/transcript.tdist" "C client (AUTO)"
echo "PASS: tdist_client_vs_torch_server_test_$TORCH_TAG (PyTorch $TORCH_VERSION, seed $INTEROP_SEED)"
