#!/usr/bin/env bash
# bench/scale/agents.sh: M emulated tdist-agents do a rendezvous round and heartbeats through the
# agent's own rendezvous code (bench/scale/agents.c) against a fresh tdist-store server per cell.
# Prints, per M: the time until all joined and until all were members (the round: each knows its
# group rank, rank base, world size, workers' store), until all had read the members' records
# (tables_s: each reads them on its first monitor call, after the round, for /status and the
# carry-over), the server's CPU seconds and peak RSS (VmHWM), its CPU per agent, and the slowest
# monitor sweep of a process's agents while held (the first holds the records' reading). The
# emulated agents share this machine's cores with the server, so their own work (each member
# parses every member's record: M^2 records in all) is in tables_s and the sweep; on a cluster
# each agent does its part on its own node. Asserts nothing.
#
#   bench/scale/agents.sh [--agents 64,512,4096] [--procs 2] [--hold-s 3] [--repeat K]
set -euo pipefail
cd "$(dirname "$0")/../.."

agents="64,512,4096"
procs=2
hold=3
repeat=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --agents) agents="$2"; shift 2 ;;
    --procs) procs="$2"; shift 2 ;;
    --hold-s) hold="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "agents.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

work="$(mktemp -d /tmp/tdist-scale-agents.XXXXXX)"
server_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

bazel build -c opt //bench/scale:scale_agents //runtime/store/cli:tdist-store >&2
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
tck="$(getconf CLK_TCK)"

printf '%7s %7s %8s %10s %9s %9s %10s %12s %12s %s\n' agents members joined_s members_s tables_s \
  srv_cpu_s srv_rss_mb us_cpu/agent sweep_max_s checks
for m in ${agents//,/ }; do
  for _ in $(seq "$repeat"); do
    rm -f "$work/port"
    "$bin/runtime/store/cli/tdist-store" serve --host 127.0.0.1 --port 0 --port-file "$work/port" \
      --quiet &
    server_pid=$!
    for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.05; done
    out="$("$bin/bench/scale/scale_agents" --port "$(cat "$work/port")" --agents "$m" \
      --procs "$procs" --hold-s "$hold" 2>"$work/err" | tail -1 || true)"
    read -r utime stime < <(awk '{print $14, $15}' "/proc/$server_pid/stat")
    hwm="$(awk '/VmHWM/ {print $2}' "/proc/$server_pid/status")"
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
    server_pid=""
    eval "$(tr ' ' '\n' <<<"$out" | grep '=')"
    cpu="$(awk -v u="$utime" -v s="$stime" -v t="$tck" 'BEGIN {printf "%.2f", (u + s) / t}')"
    printf '%7s %7s %8s %10s %9s %9s %10.1f %12.0f %12s %s\n' "$m" "${members:-0}" \
      "${joined_s:-?}" "${members_s:-?}" "${tables_s:-?}" "$cpu" "$(awk -v h="$hwm" 'BEGIN {print h / 1024}')" \
      "$(awk -v c="$cpu" -v n="$m" 'BEGIN {print c * 1e6 / n}')" "${sweep_max_s:-?}" "${checks:-?}"
    [[ "${failed:-1}" == 0 ]] || sed -n '1,2p' "$work/err" | sed 's/^/    /'
    unset members joined_s members_s tables_s sweep_max_s checks failed
  done
done
