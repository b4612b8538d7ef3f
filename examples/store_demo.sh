#!/usr/bin/env bash
# tdist store demo: `bash examples/store_demo.sh` from the repository root of a fresh clone
# (Debian 12, as root). Installs the packages of .ci/packages.txt that are missing, builds
# tdist-store with Bazel, serves on an ephemeral port, and shows the C command-line client and a
# real PyTorch 1.13 TCPStore client (/usr/bin/python3, is_master=False) sharing the store, then
# stops the server with SIGTERM. Everything is bounded in time; nothing is left running.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
TDIST_SETUP_TORCH26=0 bash .ci/setup </dev/null

echo "== building //runtime/store/cli:tdist-store"
bazel build --color=no --curses=no //runtime/store/cli:tdist-store </dev/null 2>&1 | tail -3
store="$root/bazel-bin/runtime/store/cli/tdist-store"
"$store" --version

tmp="$(mktemp -d /tmp/tdist-demo.XXXXXX)"
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== starting: tdist-store serve --port 0 --port-file $tmp/port"
"$store" serve --port 0 --port-file "$tmp/port" &
server=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "demo: the server did not start" >&2; exit 1; }
port="$(cat "$tmp/port")"
c=(--port "$port" --timeout-ms 10000)

echo "== C client (tdist-store) writes"
"$store" set greeting "hello from the tdist C client" "${c[@]}"
echo "tdist-store add counter 5  -> $("$store" add counter 5 "${c[@]}")"

echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') TCPStore client reads and writes"
timeout 60 /usr/bin/python3 - "$port" <<'PY'
import sys
from datetime import timedelta
from torch.distributed import TCPStore

store = TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=10))
print("torch get('greeting')     ->", store.get("greeting").decode())
print("torch add('counter', 10)  ->", store.add("counter", 10))
store.set("from_torch", "hello from PyTorch")
print("torch num_keys()          ->", store.num_keys())
PY

echo "== C client reads what PyTorch wrote"
echo "tdist-store get from_torch -> $("$store" get from_torch "${c[@]}")"
echo "tdist-store add counter 0  -> $("$store" add counter 0 "${c[@]}")"
echo "tdist-store num-keys       -> $("$store" num-keys "${c[@]}")"

echo "== stopping the server (SIGTERM)"
kill -TERM "$server"
rc=0
for _ in $(seq 500); do kill -0 "$server" 2>/dev/null || break; sleep 0.01; done
wait "$server" || rc=$?
server=""
echo "server exited with status $rc"
[ "$rc" -eq 0 ]
echo "demo: OK"
