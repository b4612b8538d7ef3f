#!/usr/bin/env bash
# --store-proxy under two real agents on one host (2 nodes x 2 workers of the unmodified DDP
# script, PyTorch $TDIST_TORCH: 1.13 or 2.6), attempt 0 crashing one rank mid-training so attempt
# 1 runs too: node 1's workers must reach their store through node 1's agent (MASTER_ADDR
# 127.0.0.1, MASTER_PORT the proxy's: not node 0's workers' port, a fresh proxy each attempt),
# node 0's directly; the store each attempt's workers see through the proxy must be that
# attempt's fresh one (--check-fresh-store counts rank starts in it), training and its
# all_reduce must finish, and both agents exit 0. Without the proxy the ports would be equal.
#   args: AGENT DDP_SCRIPT
set -uo pipefail
AGENT="$(realpath "$1")"; DDP="$(realpath "$2")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/torch.sh" # PY, TORCH_VERSION, free_port
T="${TEST_TMPDIR:-$(mktemp -d)}/sproxy.$$"
mkdir -p "$T/env"
pids=()
cleanup() { for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2>/dev/null; done; }
trap cleanup EXIT

port=$(free_port)
for node in 0 1; do
  (cd "$T" && exec timeout 240 "$AGENT" --http-port 0 --nnodes 2 --node-rank "$node" \
    --nproc-per-node 2 --max-restarts 1 --master-addr 127.0.0.1 --master-port "$port" \
    --store-proxy -- "$DDP" --steps 30 --crash-until-attempt 1 --seed 7 --check-fresh-store \
    --env-dump "$T/env") >"$T/agent.$node.log" 2>&1 &
  pids+=($!)
done
for node in 0 1; do
  wait "${pids[$node]}" ||
    { echo "FAIL: agent of node $node failed:"; tail -30 "$T/agent.$node.log"; exit 1; }
done
pids=()

# Every attempt's start line: node 1's say the proxy and give its port, node 0's do not.
for node in 0 1; do
  grep "started 2 worker(s)" "$T/agent.$node.log" | sed 's/.*MASTER_PORT=//' >"$T/ports.$node"
done
n0=$(wc -l <"$T/ports.0"); n1=$(wc -l <"$T/ports.1")
[ "$n0" = 2 ] && [ "$n1" = 2 ] ||
  { echo "FAIL: want 2 attempts on each node, saw $n0 and $n1"; cat "$T"/agent.*.log | tail -40; exit 1; }
if grep -q "store proxy" "$T/ports.0"; then
  echo "FAIL: node 0 (the store host) started its workers through a proxy:"; cat "$T/ports.0"; exit 1
fi
[ "$(grep -c "(the store proxy)" "$T/ports.1")" = 2 ] ||
  { echo "FAIL: node 1's workers did not get the proxy on both attempts:"; cat "$T/ports.1"; exit 1; }

$PY - "$T/env" "$T/ports.0" "$T/ports.1" <<'PYEOF' || exit 1
import json, sys
d = sys.argv[1]
direct = [l.split()[0] for l in open(sys.argv[2])]
proxied = [l.split()[0] for l in open(sys.argv[3])]
# The env dumps are of the last attempt (attempt 1).
env = {r: json.load(open(f"{d}/env.{r}.json")) for r in range(4)}
for r in range(4):
    assert env[r]["TORCHELASTIC_RESTART_COUNT"] == "1", (r, env[r]["TORCHELASTIC_RESTART_COUNT"])
for r in (0, 1):
    assert env[r]["MASTER_PORT"] == direct[1], (r, env[r]["MASTER_PORT"], direct)
for r in (2, 3):
    assert env[r]["MASTER_ADDR"] == "127.0.0.1", env[r]["MASTER_ADDR"]
    assert env[r]["MASTER_PORT"] == proxied[1], (r, env[r]["MASTER_PORT"], proxied)
    assert env[r]["MASTER_PORT"] != env[0]["MASTER_PORT"], "node 1 got node 0's store port"
assert proxied[0] != proxied[1] and direct[0] != direct[1], (direct, proxied)
print(f"node 0's workers: store ports {direct}; node 1's: proxy ports {proxied}")
PYEOF
grep -q "attempt 0 will crash" "$T"/agent.*.log ||
  { echo "FAIL: attempt 0 crashed no rank (the test's restart did not happen)"; exit 1; }
echo "PASS: store_proxy_test (PyTorch $TORCH_VERSION): node 1's workers reached their fresh store of each attempt through the agent's proxy"
