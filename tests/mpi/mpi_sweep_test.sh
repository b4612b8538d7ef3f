#!/usr/bin/env bash
# Backend "mpi": the collectives sweep (tests/pg/collectives_sweep_test.c --mpi) under mpirun,
# worlds 1 to 5: every collective, counts, dtypes and ops against the sweep's own references,
# blocking and async all_reduce, results bitwise identical on every rank.
#   mpi_sweep_test.sh SWEEP_BINARY PLUGIN
set -euo pipefail
sweep=$1
export TDIST_MPI_PLUGIN=$PWD/$2
. "$(dirname "$0")/mpi_env.sh"
# Every rank runs in this host's network namespace: Open MPI's TCP on loopback only (the container
# tests create and remove podman bridges meanwhile; a rank that picked one up failed to bind).
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
tmp=${TEST_TMPDIR:-$(mktemp -d)}
for world in 1 2 3 4 5; do
  head -c 4096 /dev/zero > "$tmp/arrivals"
  start=$(date +%s.%N)
  if ! timeout 240 "${MPIRUN[@]}" -n "$world" "$sweep" --mpi "$tmp/arrivals" > "$tmp/out" 2>&1; then
    cat "$tmp/out"
    echo "FAIL: mpi sweep, world $world"
    exit 1
  fi
  grep -c ": ok in" "$tmp/out" | grep -qx 3 || { cat "$tmp/out"; echo "FAIL: world $world: not every phase reported ok"; exit 1; }
  echo "world $world: ok in $(echo "$(date +%s.%N) - $start" | bc) s"
done
echo "PASS"
