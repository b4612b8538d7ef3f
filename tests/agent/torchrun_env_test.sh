#!/usr/bin/env bash
# The worker environment under tdist-agent against the real torchrun of the PyTorch in
# $TDIST_TORCH (1.13 or 2.6, tests/testlib/torch.sh; static rendezvous; --redirects 1 --tee 1 as
# Debian's 1.13 build needs): the same unmodified DDP script runs under both with the same flags
# and dumps its environment. Every variable torchrun adds must be there under the agent with the
# same value, except those that are per-run by nature (error-file path, run-dir, and MASTER_PORT:
# the agent gives each attempt's workers a fresh store, as PyTorch >= 2.5's torchelastic does for
# retries). The agent may add TDIST_BACKEND, TDIST_STATS_FILE, TDIST_PYTHON and the other
# version's spelling of the NCCL async-error variable (it sets NCCL_ASYNC_ERROR_HANDLING, which
# 1.13 reads, and TORCH_NCCL_ASYNC_ERROR_HANDLING, which 2.x reads: it cannot know which PyTorch
# a worker runs).
#   args: AGENT DDP_SCRIPT
set -uo pipefail
AGENT="$(realpath "$1")"; DDP="$(realpath "$2")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/torch.sh"
T="${TEST_TMPDIR:-$(mktemp -d)}/trenv.$$"; mkdir -p "$T/torchrun" "$T/agent"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
for nproc in 1 3; do
  rm -f "$T"/torchrun/* "$T"/agent/*
  P1=$(free_port); P2=$(free_port)
  (cd "$T" && timeout 180 $PY -m torch.distributed.run --nnodes 1 --nproc_per_node $nproc --max_restarts 2 \
     --master_addr 127.0.0.1 --master_port "$P1" --redirects 1 --tee 1 \
     "$DDP" --steps 5 --env-dump "$T/torchrun") >"$T/torchrun.log" 2>&1 ||
    { echo "FAIL: torchrun itself failed:"; tail -20 "$T/torchrun.log"; exit 1; }
  (cd "$T" && timeout 180 "$AGENT" --http-port -1 --nnodes 1 --node-rank 0 --nproc_per_node $nproc --max_restarts 2 \
     --master_addr 127.0.0.1 --master_port "$P2" -- "$DDP" --steps 5 --env-dump "$T/agent") \
     >"$T/agent.log" 2>&1 || { echo "FAIL: agent run failed:"; tail -20 "$T/agent.log"; exit 1; }
  $PY - "$T" "$nproc" "$P1" "$P2" <<'PYEOF' || exit 1
import json, os, sys
t, n, p1, p2 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
base = dict(os.environ)
per_run = {"TORCHELASTIC_ERROR_FILE", "MASTER_PORT", "_"}
extra_ok = {"TDIST_BACKEND", "TDIST_PYTHON", "TDIST_STATS_FILE", "NCCL_ASYNC_ERROR_HANDLING",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
for r in range(n):
    tr = json.load(open(f"{t}/torchrun/env.{r}.json"))
    ag = json.load(open(f"{t}/agent/env.{r}.json"))
    added_tr = {k: v for k, v in tr.items() if base.get(k) != v}
    added_ag = {k: v for k, v in ag.items() if base.get(k) != v}
    for k, v in added_tr.items():
        if k in per_run: continue
        assert k in ag, f"rank {r}: torchrun sets {k}={v!r}, the agent does not"
        assert ag[k] == v, f"rank {r}: {k}: torchrun {v!r}, agent {ag[k]!r}"
    for k in added_ag:
        assert k in added_tr or k in extra_ok or k in per_run, f"rank {r}: agent adds unexpected {k}"
    assert tr["MASTER_PORT"] == p1, (tr["MASTER_PORT"], p1)
    # The agent's workers reach their attempt's own store, not the agents' store on --master_port.
    assert ag["MASTER_PORT"] != p2 and 0 < int(ag["MASTER_PORT"]) < 65536, (ag["MASTER_PORT"], p2)
    for k in ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert ag[k] == tr.get(k, "1"), (k, ag[k], tr.get(k))
    for e in (tr, ag):
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{r}/error.json"), e["TORCHELASTIC_ERROR_FILE"]
    print(f"nproc {n} rank {r}: {len(added_tr)} torchrun variables matched")
PYEOF
done
echo "PASS: worker environment identical to torchrun's (PyTorch $TORCH_VERSION)"
