#!/usr/bin/env bash
# The README's main demo: `bash examples/demo.sh` from the root of a fresh clone (Debian 12, as
# root). Installs the packages of .ci/packages.txt that are missing, builds tdist-agent and the C
# data-parallel training example, and runs
#
#   tdist-agent --standalone --nproc-per-node 2 --http-port 29600 -- train ...
#
# on this machine: the agent hosts the store, starts 2 workers with torchrun's environment, and
# serves /metrics while they train; the demo scrapes it once mid-run. Exit status 0 = the job
# succeeded (loss went down and every rank ended with bitwise identical parameters).
#   DEMO_RANKS (default 2), DEMO_STEPS (default 200000), DEMO_HTTP_PORT (default 29600; 0 = any)
#   DEMO_TORCH=1 also runs the PyTorch DDP script examples/torch/ddp_train.py the same way, on
#   gloo and then on "tdist" (our collectives), showing each rank's collectives on /metrics.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
TDIST_SETUP_TORCH26=0 bash .ci/setup </dev/null
echo "== building //operator-agent:tdist-agent //examples/train:train //runtime:libtdist.so"
bazel build --color=no --curses=no -c opt //operator-agent:tdist-agent //examples/train:train \
  //runtime:libtdist.so </dev/null 2>&1 | tail -2
bin="$root/bazel-out/k8-opt/bin"
tmp="$(mktemp -d)"
trap 'kill "$agent" 2>/dev/null || true; rm -rf "$tmp"' EXIT

# show_metrics TRIES READY WHAT FILTER: while $agent runs, reads its /metrics (the port from
# $tmp/port) up to TRIES times, 0.1 s apart, until the function READY accepts $tmp/metrics; then
# prints the lines matching FILTER that are not 0. Status 0 once it printed them.
show_metrics() {
  local tries=$1 ready=$2 what=$3 filter=$4 port
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  port="$(cat "$tmp/port" 2>/dev/null || true)"
  for _ in $(seq "$tries"); do
    if curl -sf "http://127.0.0.1:$port/metrics" >"$tmp/metrics" 2>/dev/null && "$ready"; then
      echo "== while it trains, http://127.0.0.1:$port/metrics $what:"
      grep -E "$filter" "$tmp/metrics" | grep -v ' 0$' || true
      return 0
    fi
    kill -0 "$agent" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

echo "== tdist-agent --standalone --nproc-per-node ${DEMO_RANKS:-2} -- train"
"$bin/operator-agent/tdist-agent" --standalone --nproc-per-node "${DEMO_RANKS:-2}" \
  --http-port "${DEMO_HTTP_PORT:-29600}" --http-port-file "$tmp/port" \
  -- "$bin/examples/train/train" --steps "${DEMO_STEPS:-200000}" --print-every 50000 "$@" &
agent=$!
workers_running() { grep -q '^tdist_workers{state="running"} [1-9]' "$tmp/metrics"; }
show_metrics 100 workers_running "says" \
  '^tdist_(agent_state|workers|world_size|rendezvous_round|restart_count|store_keys|store_clients)' ||
  true
wait "$agent"
agent=
echo "== the C job succeeded under tdist-agent"
if [ "${DEMO_TORCH:-0}" = 1 ]; then
  echo "== tdist-agent --standalone --nproc-per-node 2 -- examples/torch/ddp_train.py (PyTorch DDP, gloo)"
  TDIST_PYTHON=/usr/bin/python3 "$bin/operator-agent/tdist-agent" --standalone --nproc-per-node 2 \
    --http-port -1 -- examples/torch/ddp_train.py
  # The same script on the "tdist" backend: its collectives run in libtdist, so each rank's
  # statistics reach the agent's /metrics. In an installed tree (the image: /opt/tdist) the agent
  # puts tdist_torch on the workers' import path itself; from the build tree the demo does.
  # tdist_torch's C++ group for this PyTorch (1.13): all_reduce from C++ (build_ext.py, about 30 s).
  echo "== building //runtime/torch:tdist_c_torch113 (tdist_torch's C++ group for PyTorch 1.13)"
  bazel build --color=no --curses=no -c opt //runtime/torch:tdist_c_torch113 </dev/null 2>&1 | tail -1
  echo "== the same on init_process_group(\"tdist\"): --backend tdist"
  export PYTHONPATH="$root/runtime/torch${PYTHONPATH:+:$PYTHONPATH}"
  export TDIST_LIBRARY="$bin/runtime/libtdist.so" TDIST_TORCH_IMPL=cpp
  export TDIST_TORCH_EXT="$bin/runtime/torch/tdist_c_torch113.so"
  rm -f "$tmp/port"
  TDIST_PYTHON=/usr/bin/python3 "$bin/operator-agent/tdist-agent" --standalone --nproc-per-node 2 \
    --http-port 0 --http-port-file "$tmp/port" \
    -- examples/torch/ddp_train.py --backend tdist --steps 400 --step-sleep 0.01 &
  agent=$!
  both_ranks_counted() { [ "$(grep -c '^tdist_collective_ops_total{.*op="all_reduce"' "$tmp/metrics")" -ge 2 ]; }
  shown=0
  show_metrics 300 both_ranks_counted "has per-rank collectives" \
    '^tdist_collective_(ops_total|bytes_total)\{' && shown=1
  wait "$agent"
  agent=
  if [ "$shown" != 1 ]; then
    echo "demo: the PyTorch job on tdist ended without per-rank all_reduce counts on /metrics" >&2
    exit 1
  fi
  echo "== the PyTorch job on tdist succeeded under tdist-agent"
fi
