#!/usr/bin/env bash
# MPI jobs with no mpirun: tdist-agent --backend mpi as the PMIx server of its ranks, across three
# pods in network namespaces (tests/agent/pods/pods.sh, dnsmasq as the cluster DNS), 2 ranks each,
# started only by the agents. The workers are plain MPI programs (tests/agent/mpi/mpi_check.c,
# mpicc-built; and the C training example on libtdist's mpi backend).
#   A. 6 ranks all-reduce random int64 vectors (checked against each rank's own sum of every
#      rank's data), see 3 distinct hosts, and MPI_Publish_name/MPI_Lookup_name go through the
#      agents' store; every agent exits 0.
#   B. the C example with --backend mpi: parameters bitwise identical on all 6 ranks; while it
#      runs, job-1's /metrics counts rank 2's all_reduce calls (the workers' stats files on the
#      mpi backend).
#   C. rank 3 (pod job-1) calls MPI_Abort(7): its agent exits 7 naming the rank and status, the
#      others end too (exit 70, naming rank 3's MPI_Abort); no restart.
#   D. pod job-2 is lost mid-job (network cut + SIGKILL) and replaced: the round restarts with a
#      fresh PMIx namespace, the job completes on attempt 1 with every check passing.
#   E. rank 5 (pod job-2) hangs before MPI_Init, so node 2 never reaches the first fence: an
#      agent whose fence times out logs that node 2 never arrived within --rdzv-timeout (8 s),
#      the ranks fail and every agent ends (no hang).
#   F. Open MPI's asynchronous modex (no data in MPI_Init's fence), one rank per pod: each rank
#      fetches its peers' data on first contact, by direct modex from the other pods' agents
#      through the store; the same all-reduce checks pass on 3 ranks. One rank per pod because
#      with two, Open MPI 4.1.4 + OpenPMIx 4.2.2 sometimes fail MPI_Init ("PML add procs failed",
#      Not found) when a rank asks for its same-node peer's data as that peer commits it: the
#      node's own libpmix answers NOT_FOUND, no agent involved, and plain mpirun does the same
#      (1 in 60 runs of 2 ASan-built ranks under load; 1 in ~10 here under ASan). docs/mpi.md
#      says so.
#   args: AGENT PODS_SH MPI_CHECK TRAIN PLUGIN MPI_ENV_SH
set -uo pipefail
AGENT="$(realpath "$1")"; PODS_SH="$(realpath "$2")"; CHECK="$(realpath "$3")"
TRAIN="$(realpath "$4")"; export TDIST_MPI_PLUGIN="$(realpath "$5")"
# shellcheck source=../mpi/mpi_env.sh
. "$6"
T="${TEST_TMPDIR:-$(mktemp -d)}/pmix.$$"; mkdir -p "$T"
SEED="${TDIST_TEST_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}"
echo "pmix_test: seed $SEED (TDIST_TEST_SEED=$SEED replays)"
# shellcheck source=pods/pods.sh
source "$PODS_SH"
pods_init job svc ns cluster.local || exit 1
pods_at_exit mpi_env_cleanup # pods_init replaced mpi_env.sh's trap
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
RDZV_TIMEOUT=30
MAX_RESTARTS=0
NPROC=2 # ranks per pod (F runs 1)

# hwloc's PCI discovery (PMIx_server_init loads the topology) parses pci.ids through
# libpciaccess, which grows its buffer by realloc: under AddressSanitizer, whose realloc always
# copies, that is quadratic, 4-9 CPU-seconds per agent, and at load 20-30 an agent took 55-145 s
# to reach the rendezvous, so the others' --rdzv-timeout ran out first (scenario E's 8 s at any
# load). Without PCI discovery it takes 2 s. The agents and their ranks need no PCI topology here.
export HWLOC_COMPONENTS=-pci

# Each scenario's job has a run id of its own, so a PMIx namespace (tdist.<run id>.<round>), and
# its ranks' Open MPI shared-memory segments (vader_segment.<host>.<job id>.<local rank>, job id
# from the namespace) go to a directory of its own: with the default run id every scenario's
# ranks had the same segment names in the host's /dev/shm, where the ranks that C, D and E kill
# leave theirs, and so did any other pmix_test running on the machine (same pod names).
RUN_ID=""

# start_agent INDEX LOGNAME CMD...: (re)creates pod job-INDEX and runs the agent in it.
start_agent() {
  local i=$1 log=$2
  shift 2
  [ -n "$(pods_ip "job-$i" 2>/dev/null)" ] || pods_start "job-$i" >/dev/null || return 1
  pods_exec "job-$i" JOB_COMPLETION_INDEX="$i" POD_NAMESPACE=ns \
    OMPI_MCA_btl_vader_backing_directory="$T/shm.$RUN_ID" -- \
    "$AGENT" --backend mpi --nnodes 3 --nproc-per-node "$NPROC" --max-restarts "$MAX_RESTARTS" \
      --run-id "$RUN_ID" \
      --service svc --master-port 29500 --heartbeat-interval 0.5 --heartbeat-timeout 3 \
      --rdzv-timeout "$RDZV_TIMEOUT" --stop-grace-period 2 --monitor-interval 0.1 \
      --http-port 29600 -- "$@" >"$T/$log.log" 2>&1
  agent_in_pod "$i"
}

# start_all NAME CMD...: the three pods first, then the three agents back to back, so that
# their rendezvous deadlines (--rdzv-timeout from each agent's start) begin together: creating a
# pod (netns, DNS published and answered) takes seconds under load.
start_all() {
  local name=$1 i
  shift
  RUN_ID="pmix-$$-$SEED-$name"
  mkdir -p "$T/shm.$RUN_ID"
  for i in 0 1 2; do pods_start "job-$i" >/dev/null || { fail "$name: pod start"; return 1; }; done
  for i in 0 1 2; do start_agent $i "$name.$i" "$@" || { fail "$name: agent start"; return 1; }; done
}

# finish WANT INDEX...: waits for those agents (300 s at most: a bound against hangs, never reached
# by a job that works, however loaded the machine); each must exit WANT.
finish() {
  local want=$1 i rc ok=1
  shift
  for i in "$@"; do
    if ! timeout 300 tail --pid="${APID[$i]}" -f /dev/null; then
      ok=0; echo "agent job-$i still running after 300 s"; pods_kill "job-$i" KILL >/dev/null
    fi
    wait "${APID[$i]}"; rc=$?
    [ "$rc" = "$want" ] || { ok=0; echo "agent job-$i exited $rc, want $want"; }
  done
  [ $ok = 1 ]
}

dump() { local f; for f in "$T/$1".*.log; do echo "== $f"; tail -40 "$f"; done; }
cleanup_pods() { local n; for n in $(pods_list); do pods_kill "$n" KILL >/dev/null 2>&1; done; }

# ok_lines NAME ATTEMPT: every rank's final line says OK on 3*NPROC ranks, 3 hosts, that attempt.
ok_lines() {
  local w=$((3 * NPROC))
  cat "$T/$1".*.log | grep -cE "^mpi_check: rank [0-$((w - 1))] of $w on job-[0-2]: [0-9]+ step\(s\) of MPI_Allreduce OK, 3 host\(s\), attempt $2\$"
}

scenario_a() {
  start_all A "$CHECK" --seed "$SEED" --steps 20 --publish || return
  if finish 0 0 1 2; then pass "A: all three agents exited 0"; else fail "A: agents"; dump A; fi
  local n
  n=$(ok_lines A 0)
  [ "$n" = 6 ] && pass "A: 6 ranks on 3 pods, started by the agents alone: MPI_Allreduce of random data right on every rank" ||
    { fail "A: $n of 6 ranks reported OK"; dump A; }
  for i in 0 1 2; do
    grep -q "PMIx server (OpenPMIx" "$T/A.$i.log" || fail "A: job-$i: no PMIx server line"
  done
  n=$(cat "$T"/A.*.log | grep -c "looked up 'tdist-check' = tdist-port-$SEED\$")
  [ "$n" = 5 ] && pass "A: MPI_Publish_name on rank 0, MPI_Lookup_name on the 5 others (through the agents' store)" ||
    fail "A: $n of 5 lookups right"
  cleanup_pods
}

scenario_b() {
  start_all B "$TRAIN" --steps 300 --step-ms 20 --print-every 20 --seed "$SEED" || return
  local v=""
  if pods_wait_for "$T/B.0.log" "step     40" 180; then
    v=$(PODS_FG_TIMEOUT=10 pods_exec_fg job-0 -- curl -s "http://job-1.svc:29600/metrics" |
      awk '$1 == "tdist_collective_ops_total{rank=\"2\",local_rank=\"0\",op=\"all_reduce\"}" { print $2 }')
  fi
  [ "${v:-0}" -gt 0 ] 2>/dev/null && pass "B: job-1's /metrics counts rank 2's all_reduce calls on the mpi backend ($v)" ||
    fail "B: no all_reduce count for rank 2 in job-1's /metrics ('$v')"
  if finish 0 0 1 2; then pass "B: all three agents exited 0"; else fail "B: agents"; dump B; fi
  if grep -hq "parameters bitwise identical on all 6 ranks" "$T"/B.0.log; then
    pass "B: the C example on libtdist's mpi backend: $(grep -h 'train: OK' "$T"/B.0.log | head -1)"
  else fail "B: no success line"; dump B; fi
  cleanup_pods
}

scenario_c() {
  local t0=$SECONDS
  start_all C "$CHECK" --seed "$SEED" --steps 100000 --step-ms 10 --abort-rank 3 --abort-status 7 || return
  if finish 7 1; then pass "C: the aborting rank's agent (job-1) exited 7, MPI_Abort's status"
  else fail "C: job-1"; dump C; fi
  grep -q "rank 3 called MPI_Abort (PMIx_Abort) with status 7" "$T/C.1.log" &&
    pass "C: job-1's log names the rank and status" || fail "C: no abort line in job-1's log"
  if finish 70 0 2; then pass "C: the other agents exited 70 (the job failed elsewhere) in $((SECONDS - t0)) s"
  else fail "C: the others"; dump C; fi
  grep -q "giving up.*: rank 3 called MPI_Abort" "$T/C.0.log" &&
    pass "C: job-0 says why: $(grep -o 'giving up.*: rank 3 called MPI_Abort[^:]*' "$T/C.0.log" | head -1)" ||
    { fail "C: job-0 does not name the abort"; dump C; }
  grep -q "restarting the workers" "$T"/C.1.log && fail "C: job-1 restarted after an abort"
  cleanup_pods
}

scenario_d() {
  MAX_RESTARTS=2
  start_all D "$CHECK" --seed "$SEED" --steps 300 --step-ms 25 || return
  if ! pods_wait_for "$T/D.0.log" "mpi_check: step 40" 180; then
    fail "D: the job did not start"; dump D; MAX_RESTARTS=0; cleanup_pods; return
  fi
  ip -n "$(pods_netns job-2)" link set eth0 down
  pods_kill job-2 KILL >/dev/null
  wait "${APID[2]}" 2>/dev/null
  sleep 1
  start_agent 2 D.2.new "$CHECK" --seed "$SEED" --steps 300 --step-ms 25 || { fail "D: restart pod"; return; }
  if finish 0 0 1 2; then pass "D: every agent exited 0 after pod job-2 was lost and replaced"
  else fail "D: agents"; dump D; fi
  local n
  n=$(cat "$T"/D.0.log "$T"/D.1.log "$T"/D.2.new.log | grep -cE "^mpi_check: rank [0-5] of 6 on job-[0-2]: 300 step\(s\) of MPI_Allreduce OK, 3 host\(s\), attempt 1\$")
  [ "$n" = 6 ] && pass "D: the job ran again on attempt 1 (a fresh PMIx namespace) and completed on all 6 ranks" ||
    { fail "D: $n of 6 ranks completed on attempt 1"; dump D; }
  MAX_RESTARTS=0
  cleanup_pods
}

scenario_e() {
  local t0=$SECONDS
  RDZV_TIMEOUT=8
  start_all E "$CHECK" --seed "$SEED" --hang-rank 5 || return
  # The first agent whose fence times out names node 2; its ranks fail and end the job, which may
  # end the other agent's wait before its own timer does. Looked for until every agent has ended
  # (each must, below), not within a fixed time: under load the ranks reach the fence late. The
  # list may name node 1 too when its ranks were more than 8 s later than node 0's.
  local i ok=0 who="" t_end=$((SECONDS + 180)) re='node\(s\) ([01], )?2 never arrived within 8 s'
  while [ $ok = 0 ]; do
    for who in 0 1; do grep -qE "$re" "$T/E.$who.log" && { ok=1; break; }; done
    [ $ok = 1 ] || [ $SECONDS -ge $t_end ] && break
    kill -0 "${APID[0]}" 2>/dev/null || kill -0 "${APID[1]}" 2>/dev/null ||
      kill -0 "${APID[2]}" 2>/dev/null || t_end=$SECONDS # all ended: one last look
    sleep 0.5
  done
  [ $ok = 1 ] && pass "E: job-$who says node 2 never reached the fence within --rdzv-timeout (8 s), after $((SECONDS - t0)) s: $(grep -oE "$re" "$T/E.$who.log" | head -1)" ||
    { fail "E: no fence timeout naming node 2"; dump E; }
  local rc_ok=1
  for i in 0 1 2; do
    if ! timeout 180 tail --pid="${APID[$i]}" -f /dev/null; then
      rc_ok=0; echo "agent job-$i still running after 180 s"; dump E; pods_kill "job-$i" KILL >/dev/null
    fi
  done
  for i in 0 1 2; do wait "${APID[$i]}"; [ $? != 0 ] || rc_ok=0; done
  [ $rc_ok = 1 ] && pass "E: every agent ended with a failure (no hang) in $((SECONDS - t0)) s" ||
    { fail "E: agents"; dump E; }
  RDZV_TIMEOUT=30
  cleanup_pods
}

scenario_f() {
  NPROC=1
  OMPI_MCA_pmix_base_async_modex=1 OMPI_MCA_pmix_base_collect_data=0 TDIST_LOG_LEVEL=debug \
    start_all F "$CHECK" --seed "$SEED" --steps 5 || { NPROC=2; return; }
  if finish 0 0 1 2; then pass "F: all three agents exited 0"; else fail "F: agents"; dump F; fi
  local n m
  n=$(ok_lines F 0)
  m=$(cat "$T"/F.*.log | grep -c "PMIx direct modex: rank [0-2]'s data from node [0-2]")
  [ "$n" = 3 ] && [ "$m" -gt 0 ] &&
    pass "F: with Open MPI's async modex, $m direct modex request(s) answered across pods; 3 ranks (1 a pod) OK" ||
    { fail "F: $n of 3 ranks OK, $m direct modex answers"; dump F; }
  NPROC=2
  cleanup_pods
}

only="${PMIX_ONLY:-abcdef}"
[[ $only == *a* ]] && scenario_a
[[ $only == *b* ]] && scenario_b
[[ $only == *c* ]] && scenario_c
[[ $only == *d* ]] && scenario_d
[[ $only == *e* ]] && scenario_e
[[ $only == *f* ]] && scenario_f
if [ $fails -gt 0 ]; then echo "pmix_test: $fails failure(s)"; exit 1; fi
echo "pmix_test: ok"
