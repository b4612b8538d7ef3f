#!/usr/bin/env bash
# tdist-agent --backend mpi as the PMIx server, on this host (no pods): what mpi4py's tests found.
# The workers are tests/agent/mpi/mpi_dyn.c (plain MPI) and mpi_check.c.
#   a. MPI_Comm_accept/MPI_Comm_connect inside one job, 1 agent x 4 ranks, twice: Open MPI
#      publishes and looks up with a wait several times; the job completes (a waiting lookup
#      never holds up the publish it waits for), the merged all-reduce of random data is right.
#   b. the same across two agents (2 nodes x 2 ranks on this host, the accepting half on node 0,
#      the connecting half on node 1): PMIx_Connect/Disconnect of one job's processes on
#      several nodes are a barrier of those nodes through the agents' store, not refused.
#   c. MPI_Comm_spawn on COMM_WORLD, refused: the job ends with a message naming the spawn (the
#      other ranks wait in it for ever otherwise), on 1 agent and on 2 (the other agent ends
#      too, naming it); no restart.
#   d. the environment mpirun gives: every rank's OMPI_COMM_WORLD_* variables, mpirun's
#      oversubscription flag (OMPI_MCA_mpi_oversubscribe: 1 ranks, and one rank more than this
#      machine's CPUs) and MPI_INFO_ENV (command, argv, wdir, maxprocs, ...) are what the same
#      program prints under mpirun, rank by rank; OMPI_UNIVERSE_SIZE excepted (mpirun's counts
#      its slots, the agent's is the job: it cannot spawn).
#   e. published names are exactly the user's, under docs/mpi.md's key: while rank 0 holds its
#      published name, the agents' store has tdist/<run>/pmix/publish/<name> (one slash) and no
#      pmix.euid (libpmix's, which a publisher of another UID then met as a duplicate key);
#      every rank looks the name up.
#   f. two agents on one host with Open MPI's shared-memory transport (vader): 2 agents x 2 ranks
#      of mpi_check (random all-reduce), three times, and mpi_dyn shared
#      (MPI_Comm_split_type(SHARED) holds each agent's own ranks, a shared window carries random
#      data): every run completes (the ranks of both agents once named the same segments in one
#      /dev/shm and crashed, exit 139; Split_type hung). Then rank 1 calls MPI_Abort while all
#      ranks run (1 agent x 2 ranks, and 2 x 2): after the agents end, /dev/shm holds no new
#      vader segment (the killed ranks' once stayed) or agent directory.
#   g. OMPI_MCA_btl_vader_backing_directory set by the user to one directory for two agents on
#      one host (each agent keeps a user's setting): the job ends before its ranks meet, the
#      agent that found the directory taken exits 1 naming the variable and what to do, the
#      other 70 naming it too; no rank crashes (they mapped each other's segments: exit 139).
#   h. an agent killed by SIGKILL (its guard survives it, as PID 1 in a pod nothing does) leaves
#      its ranks' shared-memory directory /dev/shm/tdist-mpi.*; the next agent's start on this
#      host removes it (logged), and never the directory of an agent still running (locked) or
#      of an older agent (no lock marker).
#   args: AGENT MPI_DYN MPI_CHECK PORTS_SH MPI_ENV_SH STORE_CLI
set -uo pipefail
AGENT="$(realpath "$1")"; DYN="$(realpath "$2")"; CHECK="$(realpath "$3")"
# shellcheck source=../testlib/ports.sh
. "$4"
# shellcheck source=../mpi/mpi_env.sh
. "$5"
STORE_CLI="$(realpath "$6")"
T="${TEST_TMPDIR:-$(mktemp -d)}/pmix_dyn.$$"; mkdir -p "$T"
SEED="${TDIST_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}"
echo "pmix_dyn_test: seed $SEED (TDIST_TEST_SEED=$SEED replays)"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
# A hard bound on every agent (no hang), and the agents' fence/lookup timeout: far above what
# the jobs need, even under AddressSanitizer on a loaded 2-core machine (a 2-rank accept/connect
# job took 3 min there: every MPI rank runs instrumented).
LIMIT=400
RDZV_TIMEOUT=120
# Every rank of these jobs runs on this host: Open MPI's TCP transport on loopback only. On all
# interfaces it took in a bridge that other tests' containers make and remove (podman0,
# 10.88.0.1): when it went mid-job, connects failed ("bind on local address (10.88.0.1:0)
# failed: Cannot assign requested address") and the job aborted (f: 4 of its 10 two-agent jobs
# in two ASan runs on a machine shared with container tests).
export OMPI_MCA_btl_tcp_if_include=lo

# standalone LOG NPROC CMD...: one agent of NPROC ranks; its exit code.
standalone() {
  local log=$1 n=$2
  shift 2
  timeout -k 5 "$LIMIT" "$AGENT" --standalone --http-port 0 --backend mpi --nproc-per-node "$n" \
    --rdzv-timeout "$RDZV_TIMEOUT" --stop-grace-period 2 --monitor-interval 0.1 -- "$@" \
    >"$T/$log.log" 2>&1
}

# two LOG CMD...: two agents of 2 ranks each on this host (nodes 0 and 1, node 0 hosting the
# agents' store); sets RC0 and RC1, their exit codes.
two() {
  local log=$1 mp n
  shift
  mp=$(free_port)
  for n in 0 1; do
    timeout -k 5 "$LIMIT" "$AGENT" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 \
      --master-port "$mp" --http-port 0 --backend mpi --nproc-per-node 2 \
      --rdzv-timeout "$RDZV_TIMEOUT" --stop-grace-period 2 --monitor-interval 0.1 -- "$@" \
      >"$T/$log.$n.log" 2>&1 &
    eval "PID$n=$!"
  done
  wait "$PID0"; RC0=$?
  wait "$PID1"; RC1=$?
}

dump() { echo "== $T/$1.log"; tail -40 "$T/$1.log"; }

scenario_a() {
  local i rc n
  for i in 1 2; do
    standalone "a$i" 4 "$DYN" accept --seed "$((SEED + i))"; rc=$?
    n=$(grep -cE "^mpi_dyn: rank [0-3] of 4: (accepted|connected), remote group of 2, merged 4 ranks: all-reduce OK" "$T/a$i.log")
    if [ "$rc" = 0 ] && [ "$n" = 4 ]; then
      pass "a: run $i: MPI_Comm_accept/connect inside one job (1 agent x 4 ranks): 4 ranks merged, all-reduce right"
    else
      fail "a: run $i: agent exited $rc, $n of 4 ranks connected and right"; dump "a$i"
    fi
  done
}

scenario_b() {
  local n
  # tcp only: this scenario is about connect/accept (scenario e is about shared memory)
  OMPI_MCA_btl=self,tcp two b "$DYN" accept --seed "$SEED"
  n=$(cat "$T"/b.*.log | grep -cE "^mpi_dyn: rank [0-3] of 4: (accepted|connected), remote group of 2, merged 4 ranks: all-reduce OK")
  if [ "$RC0$RC1" = 00 ] && [ "$n" = 4 ]; then
    pass "b: MPI_Comm_accept/connect inside one job across 2 agents (2 x 2 ranks): merged, all-reduce right"
  else
    fail "b: agents exited $RC0 and $RC1, $n of 4 ranks connected and right"; dump b.0; dump b.1
  fi
  grep -h "PMIx_Connect" "$T"/b.*.log && fail "b: an agent refused PMIx_Connect inside the job"
}

scenario_c() {
  local rc what="called MPI_Comm_spawn (PMIx_Spawn of 1 application(s): $DYN): refused"
  standalone c 2 "$DYN" spawn; rc=$?
  if [ "$rc" = 1 ] && grep -qF "rank 0 $what" "$T/c.log"; then
    pass "c: a refused MPI_Comm_spawn ends the job (1 agent x 2 ranks: exit 1, the log names it)"
  else
    fail "c: 1 agent: exit $rc (want 1: 124 is a hang)"; dump c
  fi
  two c2 "$DYN" spawn
  if [ "$RC0" = 1 ] && [ "$RC1" = 70 ] && grep -qF "$what" "$T/c2.0.log" &&
    grep -q "giving up.*MPI_Comm_spawn" "$T/c2.1.log"; then
    pass "c: 2 agents: the spawning rank's agent exits 1, the other 70, both name the spawn"
  else
    fail "c: 2 agents exited $RC0 and $RC1 (want 1 and 70)"; dump c2.0; dump c2.1
  fi
  grep -q "restarting the workers" "$T"/c*.log && fail "c: an agent restarted after the refusal"
}

scenario_d() {
  local np cpus
  cpus=$(nproc)
  for np in 1 $((cpus + 1)); do
    [ "$np" -le 9 ] || { echo "d: $np ranks: skipped (a machine of $cpus CPUs)"; continue; }
    (cd "$T" && timeout -k 5 "$LIMIT" "${MPIRUN[@]}" -np "$np" "$DYN" env) >"$T/d.mpirun.$np.log" 2>&1
    (cd "$T" && standalone "d.$np" "$np" "$DYN" env)
    local want got
    want=$(grep "^mpi_dyn: rank " "$T/d.mpirun.$np.log" | grep -v OMPI_UNIVERSE_SIZE | sort)
    got=$(grep "^mpi_dyn: rank " "$T/d.$np.log" | grep -v OMPI_UNIVERSE_SIZE | sort)
    if [ -n "$want" ] && [ "$want" = "$got" ] && grep -q "env OK" <<<"$got"; then
      pass "d: $np rank(s): the agent's ranks see mpirun's variables and MPI_INFO_ENV ($(grep -c . <<<"$got") lines alike; $(grep -m1 -o 'OMPI_MCA_mpi_oversubscribe=.*' <<<"$got"))"
    else
      fail "d: $np rank(s): the agent's ranks differ from mpirun's (< mpirun, > agent):"
      diff <(echo "$want") <(echo "$got") | head -30
    fi
  done
}

scenario_e() {
  local mp run="pubtest-$SEED" name="tdist-dyn-$SEED" i k got
  mp=$(free_port)
  rm -f "$T/e.hold"
  timeout -k 5 "$LIMIT" "$AGENT" --standalone --master-port "$mp" --run-id "$run" --http-port 0 \
    --backend mpi --nproc-per-node 2 --rdzv-timeout "$RDZV_TIMEOUT" -- \
    "$DYN" publish --seed "$SEED" --hold "$T/e.hold" >"$T/e.log" 2>&1 &
  local pid=$!
  for ((i = 0; i < 600; i++)); do
    grep -q "holding until" "$T/e.log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  get() { "$STORE_CLI" get "$1" --host 127.0.0.1 --port "$mp" --timeout-ms 300 2>/dev/null | tr -d '\0'; }
  got=$(get "tdist/$run/pmix/publish/$name")
  [[ $got == *"tdist-port-$SEED"* ]] &&
    pass "e: the published name is tdist/$run/pmix/publish/$name in the agents' store" ||
    { fail "e: no tdist/$run/pmix/publish/$name in the agents' store ('$got')"; }
  for k in "tdist/$run/pmix/publish/pmix.euid" "tdist/$run/pmix//publish/pmix.euid" \
    "tdist/$run/pmix//publish/$name"; do
    got=$(get "$k")
    [ -z "$got" ] || fail "e: the agents' store has $k, which nobody published"
  done
  touch "$T/e.hold"
  wait $pid; local rc=$?
  [ "$(grep -c "looked up $name = 'tdist-port-$SEED'; 'pmix.euid' not published" "$T/e.log")" = 2 ] &&
    [ "$rc" = 0 ] && pass "e: both ranks looked the name up; the job exited 0" ||
    { fail "e: agent exited $rc"; dump e; }
}

# this host's vader segments (Open MPI names them after gethostname: pods of other tests have
# theirs) and the agents' directories
shm_names() {
  ls /dev/shm 2>/dev/null | grep -E "^(vader_segment\.$(hostname)\.|tdist-mpi\.)" | sort
}

scenario_f() {
  local r n before after
  before=$(shm_names)
  for r in 1 2 3; do
    two "f$r" "$CHECK" --seed "$((SEED + r))" --steps 20
    n=$(cat "$T"/f$r.*.log | grep -cE "^mpi_check: rank [0-3] of 4 on .*: 20 step\(s\) of MPI_Allreduce OK")
    [ "$RC0$RC1" = 00 ] && [ "$n" = 4 ] &&
      pass "f: run $r: 2 agents x 2 ranks on one host, shared memory on: MPI_Allreduce right on 4 ranks" ||
      { fail "f: run $r: agents exited $RC0 and $RC1, $n of 4 ranks OK"; dump "f$r.0"; dump "f$r.1"; }
  done
  two fs "$DYN" shared --seed "$SEED"
  n=$(cat "$T"/fs.*.log | grep -cE "^mpi_dyn: rank [0-3] of 4: shared-memory node of 2 rank\(s\) \(LOCAL_WORLD_SIZE 2\), 2 window\(s\) right, all-reduce OK")
  [ "$RC0$RC1" = 00 ] && [ "$n" = 4 ] &&
    pass "f: MPI_Comm_split_type(SHARED) holds each agent's 2 ranks; shared windows and all-reduce right" ||
    { fail "f: shared: agents exited $RC0 and $RC1, $n of 4 ranks OK"; dump fs.0; dump fs.1; }
  local rc
  standalone fa1 2 "$CHECK" --seed "$SEED" --steps 100000 --step-ms 10 --abort-rank 1 --abort-status 3
  rc=$?
  [ "$rc" = 3 ] || { fail "f: abort on 1 agent: exit $rc (want 3)"; dump fa1; }
  two fa "$CHECK" --seed "$SEED" --steps 100000 --step-ms 10 --abort-rank 1 --abort-status 3
  [ "$RC0" = 3 ] && [ "$RC1" = 70 ] || { fail "f: abort: agents exited $RC0 and $RC1 (want 3, 70)"; dump fa.0; }
  after=$(shm_names)
  local new
  new=$(comm -13 <(echo "$before") <(echo "$after") | grep .)
  [ -z "$new" ] && pass "f: no vader segment or agent directory left in /dev/shm after the jobs (two aborted)" ||
    fail "f: left in /dev/shm: $(echo $new)"
}

scenario_g() {
  local d="$T/g.shm" what="OMPI_MCA_btl_vader_backing_directory=$T/g.shm: another tdist-agent"
  mkdir -p "$d"
  OMPI_MCA_btl_vader_backing_directory="$d" two g "$CHECK" --seed "$SEED" --steps 200
  # which agent finds the directory taken is a race: one exits 1, the other 70
  if [ "$((RC0 + RC1))" = 71 ] && [ "$((RC0 * RC1))" = 70 ] && grep -qF "$what" "$T/g.0.log" &&
    grep -qF "$what" "$T/g.1.log" && grep -q "Unset the variable" "$T"/g.*.log; then
    pass "g: one shared-memory directory set for two agents on one host: refused (exits $RC0, $RC1), naming the variable and what to do"
  else
    fail "g: agents exited $RC0 and $RC1 (want 1 and 70, a refusal naming $what)"; dump g.0; dump g.1
  fi
  grep -qE "signal 11|exited with code 139" "$T"/g.*.log && fail "g: a rank crashed"
  grep -q "restarting the workers" "$T"/g.*.log && fail "g: an agent restarted after the refusal"
  rm -rf "$d"
}

# the agent (the guard's child) of the agent command that pid runs under timeout(1)
agent_of() { pgrep -P "$(pgrep -P "$1" | head -1)" | head -1; }

scenario_h() {
  local before a_dir pid i apid rc
  before=$(shm_names)
  timeout -k 5 "$LIMIT" "$AGENT" --standalone --http-port 0 --backend mpi --nproc-per-node 2 \
    --rdzv-timeout "$RDZV_TIMEOUT" -- "$CHECK" --seed "$SEED" --steps 100000 --step-ms 10 \
    >"$T/h1.log" 2>&1 &
  pid=$!
  for ((i = 0; i < 600; i++)); do
    a_dir=$(comm -13 <(echo "$before") <(shm_names) | grep '^tdist-mpi\.' | head -1)
    [ -n "$a_dir" ] && grep -q "started 2 worker" "$T/h1.log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$a_dir" ] || { fail "h: the running agent made no /dev/shm/tdist-mpi.* directory"; dump h1; kill $pid; wait $pid; return; }
  standalone h2 1 "$CHECK" --seed "$SEED" --steps 2 || fail "h: a second agent's job failed"
  [ -d "/dev/shm/$a_dir" ] && pass "h: another agent's start leaves the directory of a running agent ($a_dir)" ||
    fail "h: another agent's start removed $a_dir, the directory of a running agent"
  apid=$(agent_of $pid)
  [ -n "$apid" ] && kill -9 "$apid"
  wait $pid; rc=$?
  [ "$rc" = 137 ] || { fail "h: the SIGKILLed agent's guard exited $rc (want 137)"; dump h1; }
  [ -d "/dev/shm/$a_dir" ] || echo "h: note: $a_dir went with the SIGKILLed agent"
  # an older agent's directory (no lock, no marker) may be in use: never swept
  local old_dir
  old_dir=$(mktemp -d /dev/shm/tdist-mpi.XXXXXX)
  standalone h3 1 "$CHECK" --seed "$SEED" --steps 2 || fail "h: the next agent's job failed"
  [ -d "$old_dir" ] || fail "h: the next agent's start removed $old_dir, which no agent of its kind made"
  rm -rf "$old_dir"
  if [ ! -e "/dev/shm/$a_dir" ] && grep -qF "removed /dev/shm/$a_dir" "$T/h3.log"; then
    pass "h: the next agent's start removed $a_dir, left by an agent killed with SIGKILL (logged)"
  else
    fail "h: /dev/shm/$a_dir $( [ -e "/dev/shm/$a_dir" ] && echo "is still there" || echo "went, unlogged") after the next agent's start"
    dump h3
  fi
}

only="${PMIX_DYN_ONLY:-abcdefgh}"
[[ $only == *a* ]] && scenario_a
[[ $only == *b* ]] && scenario_b
[[ $only == *c* ]] && scenario_c
[[ $only == *d* ]] && scenario_d
[[ $only == *e* ]] && scenario_e
[[ $only == *f* ]] && scenario_f
[[ $only == *g* ]] && scenario_g
[[ $only == *h* ]] && scenario_h
if [ $fails -gt 0 ]; then echo "pmix_dyn_test: $fails failure(s)"; exit 1; fi
echo "pmix_dyn_test: ok"
