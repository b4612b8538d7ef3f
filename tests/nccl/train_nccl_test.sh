#!/usr/bin/env bash
# The C training example with the nccl backend, end to end on a CPU machine: tdist-agent
# (--backend nccl, exported as TDIST_BACKEND) starts 2 workers of examples/train, which stage
# every collective through "device" memory of the group's device (tdist_pg_device) and run it
# through libtdist's nccl backend, here against the fake CUDA runtime + NCCL of this directory (a
# fault seam, not a GPU: it rejects host pointers as NCCL_CHECK_POINTERS would, and records each
# rank's communicator init). This is the wiring the k8s gpu-nccl overlay runs on GPU nodes.
# Checks: the run succeeds on the nccl backend with one communicator of 2 ranks on devices 0 and
# 1, and its loss trajectory (random seed) is identical to the same job on gloo (2 ranks: AVG is
# exact in either reduction order); a missing CUDA runtime fails with a message naming the path.
set -euo pipefail
agent="$(realpath "$1")" train="$(realpath "$2")" fake="$(realpath "$3")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/ports.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/ports.sh"   # free_port
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
seed=$(( (RANDOM << 15 | RANDOM) % 2147483647 ))
steps=$(( 40 + RANDOM % 80 ))
echo "seed $seed, $steps steps"
export TDIST_CUDART_LIBRARY="$fake" TDIST_NCCL_LIBRARY="$fake" TDIST_FAKE_CUDA_DEVICES=2
export TDIST_NCCL_SPIN_US=200 TDIST_FAKE_NCCL_DIR="$tmp/fake"
unset TDIST_BACKEND TDIST_NCCL_DEVICE
mkdir -p "$tmp/fake"

fail() { echo "FAIL: $*" >&2; exit 1; }

# run BACKEND OUT: the example under the agent, 2 workers; its exit status.
run() {
  "$agent" --standalone --nproc-per-node 2 --http-port 0 --backend "$1" -- \
    "$train" --steps "$steps" --print-every 10 --seed "$seed" >"$2" 2>&1
}

run nccl "$tmp/nccl.out" || { cat "$tmp/nccl.out"; fail "the nccl run exited $?"; }
grep -q '^train: 2 ranks (nccl backend, buffers on GPU 0)' "$tmp/nccl.out" ||
  { cat "$tmp/nccl.out"; fail "rank 0 did not report the nccl backend on GPU 0"; }
grep -q '^train: OK: ' "$tmp/nccl.out" || { cat "$tmp/nccl.out"; fail "no OK line"; }
comms=("$tmp"/fake/fakenccl-*)
[ ${#comms[@]} -eq 1 ] || fail "expected one NCCL communicator, found ${#comms[@]}"
for r in 0 1; do
  [ -f "${comms[0]}/init-$r" ] || fail "rank $r did not join the NCCL communicator"
  tr -d '\0' <"${comms[0]}/init-$r" | grep -aq "dev=$r nranks=2 " ||
    fail "rank $r's communicator is not on device $r of 2 ranks"
done

run gloo "$tmp/gloo.out" || { cat "$tmp/gloo.out"; fail "the gloo run exited $?"; }
grep -q '^train: 2 ranks (gloo backend)' "$tmp/gloo.out" || fail "the gloo run's header"
losses() { grep -E '^(step|train: OK)' "$1"; }
[ "$(grep -c '^step' "$tmp/nccl.out")" -gt 0 ] || fail "the nccl run printed no loss line to compare"
diff <(losses "$tmp/gloo.out") <(losses "$tmp/nccl.out") ||
  fail "the nccl run's losses differ from the gloo run's"
echo "ok: nccl and gloo runs agree ($(grep -c '^step' "$tmp/nccl.out") loss lines)"

# No CUDA runtime: train's init fails at once and says which library it could not open.
port=$(free_port)
set +e
TDIST_CUDART_LIBRARY=/nonexistent/libcudart.so.13 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$train" --backend nccl --steps 1 \
  >"$tmp/missing.out" 2>&1
rc=$?
set -e
[ $rc -eq 3 ] || { cat "$tmp/missing.out"; fail "a missing CUDA runtime exited $rc, not 3"; }
want='init_process_group(nccl, env://) failed: .*/nonexistent/libcudart.so.13'
grep -q "$want" "$tmp/missing.out" ||
  { cat "$tmp/missing.out"; fail "the error does not name the library path"; }
# A bad TDIST_BACKEND is a usage error naming the value.
set +e
TDIST_BACKEND=ucc "$train" --steps 1 >"$tmp/bad.out" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "TDIST_BACKEND='ucc' is not gloo, nccl or mpi" "$tmp/bad.out" ||
  { cat "$tmp/bad.out"; fail "TDIST_BACKEND=ucc: exit $rc"; }
echo "PASS"
