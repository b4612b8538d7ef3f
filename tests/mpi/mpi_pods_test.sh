#!/usr/bin/env bash
# Backend "mpi" across simulated pods without ssh: three pods in network namespaces with the
# cluster DNS (tests/agent/pods/pods.sh); mpirun runs in pod mpi-0 with a hostfile of the pods'
# DNS names, 2 slots each, and starts its daemons in the other pods through a launch agent that
# enters their network namespace (tests/mpi/pod_launch_agent.sh, in place of ssh). Runs the C
# training example with --backend mpi on 6 ranks (parameters bitwise identical on every rank,
# loss down) and the backend test's async scenario on 4 ranks over 2 pods; checks that ranks
# really sat in different pods (their hostnames) and talked over the pods' network (Open MPI's
# TCP transport between pods; shared memory inside one).
#   mpi_pods_test.sh PODS_SH TRAIN BACKEND_TEST PLUGIN AGENT
set -euo pipefail
pods_sh=$1
train=$PWD/$2
btest=$PWD/$3
export TDIST_MPI_PLUGIN=$PWD/$4
agent=$PWD/$5
. "$(dirname "$0")/mpi_env.sh"
. "$pods_sh"
[ "$(id -u)" = 0 ] || { echo "FAIL: needs root (network namespaces)"; exit 1; }
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; [ -f "$tmp/out" ] && sed 's/^/  | /' "$tmp/out"; pods_dump; exit 1; }

pods_init mpi svc ns cluster.local || exit 1
pods_at_exit mpi_env_cleanup # pods_init replaced mpi_env.sh's trap
for i in 0 1 2; do pods_start "mpi-$i" >/dev/null || fail "pods_start mpi-$i"; done
hostfile=$tmp/hostfile
: > "$hostfile"
for i in 0 1 2; do echo "$(pods_fqdn "mpi-$i") slots=2" >> "$hostfile"; done
export TDIST_PODS_PREFIX=$PODS_PREFIX
# mpirun's own options: the launch agent instead of ssh, the pods' interface for its daemons and
# for MPI's TCP transport (never the pods' loopback).
run=("${MPIRUN[@]}" --hostfile "$hostfile" --mca plm_rsh_agent "$agent"
     --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0
     -x TDIST_MPI_PLUGIN -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)

echo "== the C example, --backend mpi, 6 ranks on 3 pods"
PODS_FG_TIMEOUT=120 pods_exec_fg mpi-0 -- "${run[@]}" -n 6 --tag-output \
  sh -c 'echo "on pod $(hostname)"; exec "$0" --backend mpi --steps 60 --print-every 20' "$train" \
  > "$tmp/out" 2>&1 || fail "the training job failed"
grep -q "parameters bitwise identical on all 6 ranks" "$tmp/out" || fail "no success line"
for i in 0 1 2; do
  n=$(grep -c "on pod mpi-$i\$" "$tmp/out" || true)
  [ "$n" = 2 ] || fail "pod mpi-$i ran $n ranks, expected 2"
done
grep "train: OK" "$tmp/out" | sed 's/^/   /'

echo "== the backend's async scenario, 4 ranks on 2 pods, over TCP between them"
head -2 "$hostfile" > "$tmp/hostfile2"
run2=("${run[@]/$hostfile/$tmp/hostfile2}")
PODS_FG_TIMEOUT=120 pods_exec_fg mpi-0 -- "${run2[@]}" -n 4 --mca btl_base_verbose 30 \
  "$btest" async > "$tmp/out" 2>&1 || fail "the async scenario failed"
grep -q "mpi async scenario: ok" "$tmp/out" || fail "no success line"
ip0=$(pods_ip mpi-0) ip1=$(pods_ip mpi-1)
grep -qE "btl:tcp: path from ($ip0 to $ip1|$ip1 to $ip0):" "$tmp/out" \
  || fail "Open MPI's TCP transport found no path between pods mpi-0 ($ip0) and mpi-1 ($ip1)"
grep -m1 -E "btl:tcp: path from ($ip0 to $ip1|$ip1 to $ip0):" "$tmp/out" | sed "s/^/   /"
echo "PASS"
