#!/bin/sh
# Open MPI's launch agent for simulated pods (mpirun --mca plm_rsh_agent THIS): where mpirun
# would run `ssh HOST COMMAND...` to start its daemon (orted) on HOST, this starts COMMAND in
# HOST's pod (tests/agent/pods/pods.sh): its network namespace, with its hostname, resolv.conf
# and hosts. No ssh, no keys. HOST is the pod's name or any DNS name that starts with it.
#   TDIST_PODS_PREFIX  the netns name prefix of the pods instance (PODS_PREFIX)
set -eu
host=$1
shift
name=${host%%.*}
# ssh hands the remote shell one command line: its arguments joined by spaces.
exec ip netns exec "${TDIST_PODS_PREFIX:?}$name" unshare --uts \
  sh -c 'hostname "$1"; shift; exec sh -c "$*"' sh "$name" "$@"
