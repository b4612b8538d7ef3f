#!/usr/bin/env bash
# The worker environment under tdist-agent against the real torchrun of the PyTorch in
# $TDIST_TORCH (1.13 or 2.6, tests/testlib/torch.sh; static rendezvous; --redirects 1 --tee 1 as
# Debian's 1.13 build needs): the same unmodified DDP script runs under both with the same flags
# and dumps its environment, in four shapes: 1 node x 1 and x 3 workers; 1 node x 2 workers where
# both ranks fail on attempt 0 (before init_process_group), so the environment compared is that
# of the restarted attempt 1; and
# 2 nodes x 2 workers (two torchruns, two agents, static rendezvous on one host). Both directions,
# rank by rank: every variable torchrun adds must be there under the agent with the same value,
# and every variable the agent adds must be one torchrun adds (same value, by the first rule) or
# one of the few named below. Exceptions are per-run by nature (MASTER_PORT: the agent gives each
# attempt's workers a fresh store, as PyTorch >= 2.5's torchelastic does for retries; the
# error-file path, whose attempt_N/RANK tail is checked). The agent may add TDIST_BACKEND,
# TDIST_STATS_FILE, TDIST_PYTHON, its sitecustomize's directory in front of PYTHONPATH and
# PyTorch's flight-recorder variables (Python stacks and NCCL dumps for hang reports), and the other
# version's spelling of the NCCL async-error variable (it sets NCCL_ASYNC_ERROR_HANDLING, which
# 1.13 reads, and TORCH_NCCL_ASYNC_ERROR_HANDLING, which 2.x reads: it cannot know which PyTorch
# a worker runs). The workers' resource limits (open files, processes, core, stack, address
# space, locked memory) must be the same under both.
#   args: AGENT DDP_SCRIPT
set -uo pipefail
AGENT="$(realpath "$1")"; DDP="$(realpath "$2")"
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/torch.sh"   # PY, TORCH_VERSION, free_port
T="${TEST_TMPDIR:-$(mktemp -d)}/trenv.$$"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; }
trap cleanup EXIT

# run_case NAME NNODES NPROC ATTEMPT [DDP ARGS...]: runs the job under torchrun and under the
# agent (one launcher per node, in parallel), then compares each rank's environment of attempt
# ATTEMPT (the last attempt: its dump overwrote the earlier ones).
# Both launchers start with an open-file soft limit below the hard one (as a login shell often
# has), so that a launcher raising its own limit (the agent does, for its HTTP server: --http-port
# 0 here) and passing that on shows in the limits compared.
nofile_soft() {
  local hard
  hard=$(ulimit -Hn)
  if [ "$hard" = unlimited ] || [ "$hard" -gt 1024 ]; then ulimit -Sn 1024; fi
}

run_case() {
  local name="$1" nnodes="$2" nproc="$3" attempt="$4" node rc
  shift 4
  local d="$T/$name"
  mkdir -p "$d/torchrun" "$d/agent"
  local P1 P2
  P1=$(free_port); P2=$(free_port)
  pids=()
  for node in $(seq 0 $((nnodes - 1))); do
    (cd "$d" && nofile_soft && exec timeout 180 $PY -m torch.distributed.run --nnodes "$nnodes" --node_rank "$node" \
       --nproc_per_node "$nproc" --max_restarts 2 --master_addr 127.0.0.1 --master_port "$P1" \
       --redirects 1 --tee 1 "$DDP" --steps 5 --env-dump "$d/torchrun" "$@") \
      >"$d/torchrun.$node.log" 2>&1 &
    pids+=($!)
  done
  for node in "${!pids[@]}"; do
    wait "${pids[$node]}" ||
      { echo "FAIL: $name: torchrun (node $node) failed:"; tail -20 "$d/torchrun.$node.log"; exit 1; }
  done
  pids=()
  for node in $(seq 0 $((nnodes - 1))); do
    (cd "$d" && nofile_soft && exec timeout 180 "$AGENT" --http-port 0 --nnodes "$nnodes" --node-rank "$node" \
       --nproc_per_node "$nproc" --max_restarts 2 --master_addr 127.0.0.1 --master_port "$P2" \
       -- "$DDP" --steps 5 --env-dump "$d/agent" "$@") >"$d/agent.$node.log" 2>&1 &
    pids+=($!)
  done
  for node in "${!pids[@]}"; do
    wait "${pids[$node]}" ||
      { echo "FAIL: $name: agent (node $node) failed:"; tail -20 "$d/agent.$node.log"; exit 1; }
  done
  pids=()
  $PY - "$d" "$name" "$nnodes" "$nproc" "$attempt" "$P1" "$P2" <<'PYEOF' || exit 1
import json, os, sys
d, name = sys.argv[1], sys.argv[2]
nnodes, nproc, attempt = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p1, p2 = sys.argv[6], sys.argv[7]
base = dict(os.environ)
per_run = {"TORCHELASTIC_ERROR_FILE", "MASTER_PORT", "_"}
extra_ok = {"TDIST_BACKEND", "TDIST_PYTHON", "TDIST_STATS_FILE", "NCCL_ASYNC_ERROR_HANDLING",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
            "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "PYTHONPATH"}
world = nnodes * nproc
files = tuple(sorted(f for f in os.listdir(f"{d}/{w}") if f.startswith("env.")) for w in ("torchrun", "agent"))
want = sorted(f"env.{r}.json" for r in range(world))
assert files[0] == want and files[1] == want, f"{name}: env dumps {files}, want {want}"
for r in range(world):
    tr = json.load(open(f"{d}/torchrun/env.{r}.json"))
    ag = json.load(open(f"{d}/agent/env.{r}.json"))
    added_tr = {k: v for k, v in tr.items() if base.get(k) != v}
    added_ag = {k: v for k, v in ag.items() if base.get(k) != v}
    assert len(added_tr) >= 15, f"{name} rank {r}: torchrun added only {sorted(added_tr)}"
    # torchrun -> agent: every variable, the same value
    for k, v in added_tr.items():
        if k in per_run: continue
        assert k in ag, f"{name} rank {r}: torchrun sets {k}={v!r}, the agent does not"
        assert ag[k] == v, f"{name} rank {r}: {k}: torchrun {v!r}, agent {ag[k]!r}"
    # agent -> torchrun: nothing torchrun does not set, but the named extras
    for k, v in added_ag.items():
        if k in extra_ok or k in per_run: continue
        assert k in added_tr, f"{name} rank {r}: the agent sets {k}={v!r}, torchrun does not"
    # what the comparison stands on: this rank of this attempt, under both
    for e, who in ((tr, "torchrun"), (ag, "agent")):
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == str(world), (name, who, r)
        assert e["GROUP_RANK"] == str(r // nproc) and e["LOCAL_RANK"] == str(r % nproc), (name, who, r)
        assert e["TORCHELASTIC_RESTART_COUNT"] == str(attempt), (name, who, r, e["TORCHELASTIC_RESTART_COUNT"])
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_{attempt}/{r % nproc}/error.json"), \
            (name, who, e["TORCHELASTIC_ERROR_FILE"])
    assert tr["MASTER_PORT"] == p1, (tr["MASTER_PORT"], p1)
    # The agent's workers reach their attempt's own store, not the agents' store on --master_port.
    assert ag["MASTER_PORT"] != p2 and 0 < int(ag["MASTER_PORT"]) < 65536, (ag["MASTER_PORT"], p2)
    for k in ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert ag[k] == tr.get(k, "1"), (k, ag[k], tr.get(k))
    # The agent's observability extras (docs/agent.md, "Python stacks and flight-recorder
    # dumps"): its sitecustomize's directory first on PYTHONPATH, the rest as torchrun has it;
    # the flight recorder's dumps into the attempt's directory; the stacks variables consumed
    # by the sitecustomize at start-up (so absent from the script's environment).
    pp = ag["PYTHONPATH"].split(":")
    assert pp[0].endswith("/python"), pp  # RUN_DIR/python (removed with the run directory)
    assert ":".join(pp[1:]) == tr.get("PYTHONPATH", ""), (pp, tr.get("PYTHONPATH"))
    assert ag["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].endswith(f"/attempt_{attempt}/nccl_trace_rank_"), \
        ag["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    assert (ag["TORCH_NCCL_TRACE_BUFFER_SIZE"], ag["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == ("2000", "1")
    assert not [k for k in ag if k.startswith("TDIST_PY_STACKS_")], sorted(ag)
    # Resource limits as the launcher was started with them (the agent raises its own open-file
    # soft limit for its HTTP connections; its workers must not inherit that).
    ltr = json.load(open(f"{d}/torchrun/limits.{r}.json"))
    lag = json.load(open(f"{d}/agent/limits.{r}.json"))
    assert ltr == lag, f"{name} rank {r}: resource limits: torchrun {ltr}, agent {lag}"
    print(f"{name} rank {r}: {len(added_tr)} torchrun variables and {len(added_ag)} of the agent's matched; limits equal (open files {lag['RLIMIT_NOFILE']})")
PYEOF
  echo "PASS: $name: worker environment identical to torchrun's (PyTorch $TORCH_VERSION)"
}

run_case nproc1 1 1 0
run_case nproc3 1 3 0
# Every rank of attempt 0 fails before init_process_group: torchrun 2.6 itself cannot be relied
# on to restart a job where any rank of attempt 0 reached gloo's set-up (issue 12: 3 of 10
# restarts; attempt 1 reads attempt 0's gloo addresses from torchrun's store and fails or hangs).
# What is compared is the environment of attempt 1, which does not depend on how attempt 0 died.
run_case restarted 1 2 1 --fail-rank all --fail-attempt 0 --fail-before-init
run_case nodes2 2 2 0
echo "PASS: worker environment identical to torchrun's in every shape (PyTorch $TORCH_VERSION)"
