#!/usr/bin/env bash
# MPI job start-up: seconds from starting the launcher to MPI_Init having returned on every rank,
# on the same simulated pods (tests/agent/pods/pods.sh: network namespaces, dnsmasq as the cluster
# DNS), 3 pods x 2 ranks of a plain MPI program (tests/agent/mpi/mpi_check.c --init-time), two
# ways, interleaved within each repetition:
#   tdist-agent  one tdist-agent --backend mpi per pod (the PMIx server of its ranks), all started
#                at t0; no mpirun, no ssh
#   mpirun       Open MPI's mpirun in pod 0 at t0 with a hostfile of the pods' DNS names, 2 slots
#                each, starting its daemons in the other pods through a launch agent that enters
#                their network namespace where ssh would log in (tests/mpi/pod_launch_agent.sh;
#                real ssh would add its own handshake)
# The time is max over ranks of the wall-clock time MPI_Init returned, minus t0. Prints a table
# of median [min..max] per launcher; asserts nothing. Needs root.
#   bash bench/agent/mpi_startup.sh [--runs N]        (default 5; ~1 min)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "mpi_startup.sh: unknown option '$1' (see --help)" >&2; exit 64 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "mpi_startup.sh: needs root (network namespaces)" >&2; exit 1; }
bazel build -c opt //operator-agent:tdist-agent //tests/agent:mpi_check >/dev/null 2>&1 ||
  { echo "mpi_startup.sh: bazel build failed" >&2; exit 1; }
B=$(bazel info -c opt bazel-bin 2>/dev/null)
AGENT=$B/operator-agent/tdist-agent CHECK=$B/tests/agent/mpi_check
LAUNCH=$PWD/tests/mpi/pod_launch_agent.sh
. tests/mpi/mpi_env.sh
T=$(mktemp -d /tmp/mpi_startup.XXXXXX)
. tests/agent/pods/pods.sh
pods_init job svc ns cluster.local || exit 1
for i in 0 1 2; do pods_start "job-$i" >/dev/null; done
export TDIST_PODS_PREFIX=$PODS_PREFIX
: >"$T/hostfile"
for i in 0 1 2; do echo "$(pods_fqdn "job-$i") slots=2" >>"$T/hostfile"; done

now() { date +%s.%N; }
# last_init LOG...: the latest "MPI_Init returned at" time over the 6 ranks ("" unless all 6)
last_init() {
  cat "$@" | awk '/MPI_Init returned at/ { n++; t = $NF; if (t > m) m = t } END { if (n == 6) printf "%.6f", m }'
}

run_agents() {
  local i t0 pids=()
  t0=$(now)
  for i in 0 1 2; do
    pods_exec "job-$i" JOB_COMPLETION_INDEX="$i" POD_NAMESPACE=ns -- \
      "$AGENT" --backend mpi --nnodes 3 --nproc-per-node 2 --service svc --master-port 29500 \
      --http-port -1 --rdzv-timeout 60 -- "$CHECK" --init-time >"$T/agent.$i.log" 2>&1
    pids+=("$PODS_PID")
  done
  for i in 0 1 2; do wait "${pids[$i]}" || echo "agent job-$i failed: $(tail -3 "$T/agent.$i.log")" >&2; done
  local t1
  t1=$(last_init "$T"/agent.*.log)
  [ -n "$t1" ] && echo "$t1 - $t0" | bc -l
}

run_mpirun() {
  local t0 t1
  t0=$(now)
  PODS_FG_TIMEOUT=120 pods_exec_fg job-0 -- mpirun --oversubscribe --hostfile "$T/hostfile" \
    --mca plm_rsh_agent "$LAUNCH" --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 \
    -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -n 6 "$CHECK" --init-time \
    >"$T/mpirun.log" 2>&1 || echo "mpirun failed: $(tail -3 "$T/mpirun.log")" >&2
  t1=$(last_init "$T/mpirun.log")
  [ -n "$t1" ] && echo "$t1 - $t0" | bc -l
}

declare -a A M
for ((r = 1; r <= runs; r++)); do
  a=$(run_agents); m=$(run_mpirun)
  printf 'run %d: tdist-agent %s s, mpirun %s s\n' "$r" "${a:-FAILED}" "${m:-FAILED}"
  [ -n "$a" ] && A+=("$a"); [ -n "$m" ] && M+=("$m")
done
stats() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.3f [%.3f..%.3f] (%d runs)", v[int((NR + 1) / 2)], v[1], v[NR], NR; else printf "no run" }'; }
echo
echo "MPI start-up, 3 pods x 2 ranks, launcher start -> MPI_Init returned on every rank (median [min..max]):"
echo "| launcher | seconds |"
echo "|---|---|"
echo "| tdist-agent --backend mpi (PMIx server per pod) | $(stats "${A[@]}") |"
echo "| mpirun + hostfile + launch agent (no ssh) | $(stats "${M[@]}") |"
[ -n "${KEEP:-}" ] && echo "logs in $T" || rm -rf "$T"
