#!/usr/bin/env bash
# bench/scale/run.sh: N emulated PyTorch 2.x ranks start up against one job's store
# (bench/scale/ranks.c: connect, VALIDATE, PING, ADD init/, gloo's address exchange, the
# store-based barrier), against tdist-store and PyTorch 2.6's own TCPStore server (the
# non-libuv server Debian builds, tests/testlib/torch26) in the same run, a fresh server for
# every cell. Prints, per server and N: time to all connected / addresses exchanged / barrier
# passed, the server's CPU seconds and peak RSS (VmHWM), and the server CPU per rank, so the
# growth with N (the slope) shows. A server that cannot hold N connections in one process (the
# open-file limit, about 19,900 here) fails its cell; the table says so. Asserts nothing.
#
# "proxy" is tdist-store behind store proxies, as a job with the agents' proxies runs: one proxy
# per node of --per-node ranks (8), emulated as `tdist-store proxy --instances K` processes of up
# to 1,500 nodes each (one process holds ~19,900 sockets); the ranks connect to their node's
# proxy. Its srv_cpu_s and srv_rss_mb are the root server's; proxy_cpu_s is all proxies' CPU
# (on a cluster each node's proxy runs on its own node, 1/nodes of it). "mux" is the server as
# such a job's store host sees it without the proxies' and ranks' sockets on this machine: the
# emulated nodes speak the proxy's frames themselves (scale_ranks --mux 8), every rank still
# doing its whole start-up as a connection of its own on the server.
#
#   bench/scale/run.sh [--ranks 1000,4000,16000] [--servers tdist,proxy,mux,torch26] [--repeat K]
#                      [--per-node 8]
set -euo pipefail
cd "$(dirname "$0")/../.."

ranks="1000,4000,16000"
servers="tdist,proxy,mux,torch26"
repeat=1
per_node=8
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --per-node) per_node="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

work="$(mktemp -d /tmp/tdist-scale.XXXXXX)"
server_pid=""
proxy_pids=()
cleanup() {
  stop_proxies
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

bazel build -c opt //bench/scale:scale_ranks //runtime/store/cli:tdist-store >&2
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"

# start_server NAME: starts a fresh server on 127.0.0.1, sets server_pid and port.
start_server() {
  rm -f "$work/port"
  case "$1" in
    tdist|proxy|mux)
      "$bin/runtime/store/cli/tdist-store" serve --host 127.0.0.1 --port 0 --port-file "$work/port" --quiet &
      server_pid=$! ;;
    torch26)
      # sleeps until its stdin (a fifo we hold) closes, so it dies with us
      rm -f "$work/fifo"; mkfifo "$work/fifo"
      tests/testlib/torch26/python3 -c '
import datetime, os, sys
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, use_libuv=False, timeout=datetime.timedelta(seconds=600))
open(sys.argv[1] + ".tmp", "w").write("%d\n" % s.port); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
sys.stdin.read()' "$work/port" <"$work/fifo" &
      server_pid=$!
      exec 9>"$work/fifo" ;;
    *) echo "run.sh: unknown server '$1' (tdist, proxy, mux, torch26)" >&2; exit 2 ;;
  esac
  for _ in $(seq 600); do [[ -s "$work/port" ]] && break; sleep 0.1; done
  [[ -s "$work/port" ]] || { echo "run.sh: server $1 did not start" >&2; exit 1; }
  port="$(cat "$work/port")"
}

# start_proxies N: one proxy per node of $per_node ranks in front of the server on $port, in
# processes of at most 2,000 nodes; writes their ports to $work/targets (rank r's node is line
# r / per_node + 1, as scale_ranks maps ranks to targets).
start_proxies() {
  local n="$1" nodes procs per p
  nodes=$(( (n + per_node - 1) / per_node ))
  procs=$(( (nodes + 1499) / 1500 ))
  per=$(( (nodes + procs - 1) / procs ))
  : >"$work/targets"
  for ((p = 0; p < procs; p++)); do
    local k=$(( nodes - p * per < per ? nodes - p * per : per ))
    rm -f "$work/pport.$p"
    "$bin/runtime/store/cli/tdist-store" proxy --upstream "127.0.0.1:$port" --instances "$k" \
      --port-file "$work/pport.$p" --quiet &
    proxy_pids+=($!)
  done
  for ((p = 0; p < procs; p++)); do
    for _ in $(seq 600); do [[ -s "$work/pport.$p" ]] && break; sleep 0.1; done
    [[ -s "$work/pport.$p" ]] || { echo "run.sh: proxy process $p did not start" >&2; exit 1; }
    sed 's/^/127.0.0.1:/' "$work/pport.$p" >>"$work/targets"
  done
}

# proxies_cpu: the CPU seconds of every proxy process so far.
proxies_cpu() {
  local tck t=0 p u s
  tck="$(getconf CLK_TCK)"
  for p in "${proxy_pids[@]+"${proxy_pids[@]}"}"; do
    read -r u s < <(awk '{print $14, $15}' "/proc/$p/stat")
    t=$((t + u + s))
  done
  awk -v t="$t" -v k="$tck" 'BEGIN {printf "%.2f", t / k}'
}

stop_proxies() {
  local p
  for p in "${proxy_pids[@]+"${proxy_pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${proxy_pids[@]+"${proxy_pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  proxy_pids=()
}

stop_server() {
  exec 9>&- 2>/dev/null || true
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

printf '%-8s %7s %6s %9s %9s %9s %8s %9s %10s %7s %11s\n' server ranks ready connect_s exchange_s ready_s srv_cpu_s srv_rss_mb us_cpu/rank client_s proxy_cpu_s
for n in ${ranks//,/ }; do
  for r in $(seq "$repeat"); do
    for s in ${servers//,/ }; do
      start_server "$s"
      targets="127.0.0.1:$port"
      pcpu="-"
      if [[ "$s" == proxy ]]; then
        start_proxies "$n"
        targets="$work/targets"
        pcpu0="$(proxies_cpu)"
      fi
      # More source addresses only past one address's ~28,000 ephemeral ports: with them, torch
      # 2.6's server took 62 s for 1,000 ranks (330 retransmitted segments), 1.4 s without.
      src=()
      ((n > 25000)) && src=(--src 127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4)
      [[ "$s" == mux ]] && src=(--mux "$per_node" --procs 1)
      out="$("$bin/bench/scale/scale_ranks" --targets "$targets" --world "$n" "${src[@]}" \
        --timeout-s 120 2>"$work/err" || true)"
      read -r utime stime < <(awk '{print $14, $15}' "/proc/$server_pid/stat")
      hwm="$(awk '/VmHWM/ {print $2}' "/proc/$server_pid/status")"
      if [[ "$s" == proxy ]]; then
        pcpu="$(awk -v a="$(proxies_cpu)" -v b="$pcpu0" 'BEGIN {printf "%.2f", a - b}')"
        stop_proxies
      fi
      stop_server
      tck="$(getconf CLK_TCK)"
      eval "$(tr ' ' '\n' <<<"$out" | grep '=' )"
      cpu="$(awk -v u="$utime" -v s="$stime" -v t="$tck" 'BEGIN {printf "%.2f", (u + s) / t}')"
      printf '%-8s %7s %6s %9s %9s %9s %8s %9.0f %10.0f %7s %11s\n' "$s" "$n" "${ready:-0}" "${connected_s:-?}" \
        "${exchanged_s:-?}" "${ready_s:-?}" "$cpu" "$((hwm / 1024))" \
        "$(awk -v c="$cpu" -v n="$n" 'BEGIN {print c * 1e6 / n}')" "${clients_cpu_s:-?}" "$pcpu"
      [[ "${failed:-0}" == 0 ]] || sed -n '1,2p' "$work/err" | sed 's/^/    /'
      unset ready failed connected_s exchanged_s ready_s clients_cpu_s
    done
  done
done
