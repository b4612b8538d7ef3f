#!/usr/bin/env bash
# tdist-agent --standalone end to end: real agent binary, real workers (the C training example and
# an unmodified PyTorch DDP script, under the PyTorch version of $TDIST_TORCH: 1.13 or 2.6, see
# tests/testlib/torch.sh), real restarts, signals, exit codes and the HTTP endpoints checked with
# curl, promtool and python's json module.
#   args: AGENT TRAIN_BIN DDP_SCRIPT
set -uo pipefail
AGENT="$(realpath "$1")"; TRAIN="$(realpath "$2")"; DDP="$(realpath "$3")"
T="${TEST_TMPDIR:-$(mktemp -d)}/standalone.$$"
mkdir -p "$T"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
cleanup() { pkill -KILL -P $$ 2>/dev/null || true; }
trap cleanup EXIT
export TDIST_LOG_LEVEL=info

# Every run is bounded: a hang fails that check (exit 124) instead of the whole test, and leaves
# a report (process tree, native and Python stacks) on the test's stderr, fd 9.
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
. "$LIB/bounded.sh"
# PY and TDIST_PYTHON ("x.py" workers run as $TDIST_PYTHON -u x.py): the PyTorch under test.
. "$LIB/torch.sh"
exec 9>&2
agent() { bounded 120 "$AGENT" --http-port -1 --monitor-interval 0.05 --stop-grace-period 3 "$@"; }

# 1. The C example with 2 workers.
if agent --standalone --nproc-per-node 2 -- "$TRAIN" --steps 40 >"$T/c.out" 2>"$T/c.err"; then
  grep -q "started 2 worker(s)" "$T/c.err" && pass "C training example, 2 workers" ||
    fail "C example: no start line"; else fail "C example exit $? ($(tail -3 "$T/c.err"))"; fi

# 2. PyTorch DDP (gloo) with 2 workers: env dump checked against the torchrun contract (workers of
#    every version get both spellings of the NCCL async-error variable: see workers.c).
mkdir -p "$T/env"
if agent --standalone --nproc-per-node 2 -- "$DDP" --env-dump "$T/env" >"$T/py.out" 2>"$T/py.err"; then
  grep -q "^ddp_train: PyTorch $TORCH_VERSION, world 2" "$T/py.out" &&
  grep -q "params identical: True" "$T/py.out" && pass "PyTorch $TORCH_VERSION DDP script, 2 workers" ||
    fail "DDP: no success line: $(tail -3 "$T/py.out")"
else fail "DDP exit $? ($(tail -15 "$T/py.err"; tail -5 "$T/py.out"))"; fi
if $PY - "$T/env" <<'PYEOF'
import json, sys, os
d = sys.argv[1]
envs = [json.load(open(os.path.join(d, f"env.{r}.json"))) for r in range(2)]
for r, e in enumerate(envs):
    want = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": "2",
            "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "OMP_NUM_THREADS": "1", "NCCL_ASYNC_ERROR_HANDLING": "1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    for k, v in want.items():
        assert e.get(k) == v, (r, k, e.get(k), v)
    assert 1 <= int(e["MASTER_PORT"]) <= 65535
    assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{r}/error.json"), e["TORCHELASTIC_ERROR_FILE"]
    assert len(e["TORCHELASTIC_RUN_ID"]) == 36, e["TORCHELASTIC_RUN_ID"]  # uuid4
assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
PYEOF
then pass "worker environment matches the torchrun contract"; else fail "worker environment"; fi

# 3. Rank 1 raises on attempt 0: restarted, succeeds on attempt 1; root cause from the error file.
if agent --standalone --nproc-per-node 2 --max-restarts 1 -- "$DDP" --fail-rank 1 --fail-attempt 0 \
     >"$T/r.out" 2>"$T/r.err"; then
  grep -q "attempt 1 loss" "$T/r.out" && pass "restart after a failure on attempt 0" ||
    fail "restart: no attempt-1 success ($(tail -3 "$T/r.out"))"
  grep -q "message: ValueError: deliberate failure of rank 1 on attempt 0" "$T/r.err" &&
    pass "root cause read from TORCHELASTIC_ERROR_FILE" || fail "root cause missing: $(grep -i 'root' "$T/r.err")"
else fail "restart run exit $? ($(tail -5 "$T/r.err"))"; fi

# 4. Restarts exhausted: the agent exits with the worker's code (3), or 128+N for a signal.
#    Rank 0 exits 3 without an error file; rank 1 then fails in DDP's first collective and writes
#    one: the root cause is still rank 0, the first to fail.
agent --standalone --nproc-per-node 2 --max-restarts 1 -- "$DDP" --fail-rank 0 --fail-attempt 0 --fail-code 3 \
  >/dev/null 2>"$T/x0.err"; rc=$?
[ $rc -eq 0 ] && pass "fail on attempt 0 only, max-restarts 1: succeeds" || fail "expected 0, got $rc"
grep -q "worker failed (root cause): rank 0 (local_rank 0) exited with code 3;" "$T/x0.err" &&
  pass "root cause: the rank that exited first without an error file" ||
  fail "root cause: $(grep 'root cause' "$T/x0.err")"
agent --standalone --nproc-per-node 2 --max-restarts 2 -- sh -c '[ "$LOCAL_RANK" = 1 ] && exit 7; sleep 30' \
  >/dev/null 2>"$T/x.err"; rc=$?
[ $rc -eq 7 ] && pass "restarts exhausted: exit code 7 passed through" || fail "expected 7, got $rc"
[ "$(grep -c 'restarting the workers' "$T/x.err")" = 2 ] && pass "two restarts before giving up" ||
  fail "restart count: $(grep -c 'restarting the workers' "$T/x.err")"
agent --standalone --nproc-per-node 1 -- sh -c 'kill -9 $$' >/dev/null 2>"$T/k.err"; rc=$?
[ $rc -eq 137 ] && pass "worker killed by SIGKILL: exit 137" || fail "expected 137, got $rc"
agent --standalone --nproc-per-node 1 -- /nonexistent/program >/dev/null 2>"$T/n.err"; rc=$?
[ $rc -eq 127 ] && grep -q "cannot execute worker command '/nonexistent/program'" "$T/n.err" &&
  pass "missing worker command named (exit $rc)" || fail "missing command: rc $rc $(tail -2 "$T/n.err")"

# not_running PID...: 0 if no PID is a live process (gone, or a zombie about to be reaped); at
# least one PID is required, so an empty list fails.
not_running() {
  [ $# -gt 0 ] || return 1
  local p st
  for p in "$@"; do
    st="$(ps -o stat= -p "$p" 2>/dev/null | tr -d ' ')"
    [ -z "$st" ] || [ "${st#Z}" != "$st" ] || return 1
  done
}

# 5. SIGTERM: forwarded to the workers' process groups; a worker ignoring it is SIGKILLed after
#    the grace period; the agent exits 143; no process is left behind, the workers' own
#    background children (grandchildren of the agent, pids recorded) included.
cat >"$T/term.sh" <<'SH'
trap 'echo "$LOCAL_RANK got TERM" >> "$OUT"; [ "$LOCAL_RANK" = 0 ] && exit 0' TERM
(sleep 300 & echo "$!" >> "$OUT.grandchildren") ; echo "$LOCAL_RANK up" >> "$OUT"
while :; do sleep 0.05; done
SH
export OUT="$T/term.log"
"$AGENT" --http-port -1 --stop-grace-period 3 --standalone --nproc-per-node 2 -- bash "$T/term.sh" \
  >/dev/null 2>"$T/t.err" &
apid=$!
for _ in $(seq 100); do [ "$(grep -c up "$T/term.log" 2>/dev/null)" = 2 ] && break; sleep 0.1; done
kill -TERM $apid; wait $apid; rc=$?
[ $rc -eq 143 ] && pass "SIGTERM: agent exits 143" || fail "SIGTERM exit $rc"
grep -q '^0 got TERM' "$T/term.log" && grep -q '^1 got TERM' "$T/term.log" &&
  [ "$(grep -c 'got TERM' "$T/term.log")" = 2 ] && pass "SIGTERM forwarded to both workers" || fail "forwarding: $(cat "$T/term.log")"
grep -q "sending SIGKILL" "$T/t.err" && pass "worker ignoring SIGTERM got SIGKILL after the grace period" || fail "no SIGKILL escalation"
sleep 0.3
if pgrep -f "$T/term.sh" >/dev/null; then fail "workers left running"; else pass "no worker left behind"; fi
gc=($(cat "$T/term.log.grandchildren" 2>/dev/null))
[ "${#gc[@]}" = 2 ] && not_running "${gc[@]}" &&
  pass "the workers' background children (grandchildren ${gc[*]}) stopped too" ||
  fail "grandchildren: recorded '${gc[*]}' (want 2), $(ps -o pid,stat,args -p "${gc[*]:-1}" | tail -n +2)"

# 5a. SIGHUP and SIGUSR2 are forwarded to every worker and the job goes on (exit 0); SIGINT and
#     SIGQUIT are forwarded too and stop the job: the agent exits 128+N (130, 131).
cat >"$T/sig.sh" <<'SH'
ulimit -c 0
trap 'echo "$LOCAL_RANK got HUP" >> "$OUT"' HUP
trap 'echo "$LOCAL_RANK got USR2" >> "$OUT"' USR2
trap 'echo "$LOCAL_RANK got INT" >> "$OUT"; exit 0' INT
trap 'echo "$LOCAL_RANK got QUIT" >> "$OUT"; exit 0' QUIT
echo "$LOCAL_RANK up" >> "$OUT"
while [ ! -e "$GO" ]; do sleep 0.05; done
SH
# wait_lines FILE PATTERN N: until FILE has N lines matching PATTERN (at most 10 s).
wait_lines() {
  local c
  for _ in $(seq 100); do
    c=$(grep -c "$2" "$1" 2>/dev/null)
    [ "${c:-0}" -ge "$3" ] && return 0
    sleep 0.1
  done
  return 1
}
export OUT="$T/hup.log" GO="$T/hup.go"
"$AGENT" --http-port -1 --standalone --nproc-per-node 2 --monitor-interval 0.05 -- bash "$T/sig.sh" \
  >/dev/null 2>"$T/hup.err" &
apid=$!
wait_lines "$OUT" up 2
kill -HUP $apid; wait_lines "$OUT" 'got HUP' 2
kill -USR2 $apid; wait_lines "$OUT" 'got USR2' 2
touch "$GO"; wait $apid; rc=$?
for sig in HUP USR2; do
  [ "$(grep -c "^0 got $sig$" "$OUT")" = 1 ] && [ "$(grep -c "^1 got $sig$" "$OUT")" = 1 ] &&
    pass "SIG$sig forwarded to both workers once" || fail "SIG$sig forwarding: $(tr '\n' ' ' <"$OUT")"
done
[ $rc -eq 0 ] && grep -q "forwarding Hangup to the workers" "$T/hup.err" &&
  grep -q "forwarding User defined signal 2 to the workers" "$T/hup.err" &&
  pass "after SIGHUP and SIGUSR2 the job went on and completed (exit 0)" ||
  fail "SIGHUP/SIGUSR2: exit $rc, $(grep -E 'forwarding| E ' "$T/hup.err" | head -3)"
for sig in INT QUIT; do
  n=$(kill -l "$sig"); export OUT="$T/$sig.log" GO="$T/$sig.go"
  "$AGENT" --http-port -1 --standalone --nproc-per-node 2 --monitor-interval 0.05 \
    --stop-grace-period 3 -- bash "$T/sig.sh" >/dev/null 2>"$T/$sig.err" &
  apid=$!
  wait_lines "$OUT" up 2
  kill -"$sig" $apid; wait $apid; rc=$?
  [ $rc -eq $((128 + n)) ] && [ "$(grep -c "^[01] got $sig$" "$OUT")" = 2 ] &&
    grep -q "^0 got $sig$" "$OUT" && grep -q "exiting with $((128 + n))" "$T/$sig.err" &&
    ! grep -q "sending SIGKILL" "$T/$sig.err" &&
    pass "SIG$sig forwarded to both workers, which exited; agent exits $((128 + n))" ||
    fail "SIG$sig: exit $rc (want $((128 + n))), $(tr '\n' ' ' <"$OUT"); $(grep -E 'received|E ' "$T/$sig.err" | head -2)"
  touch "$GO"
done

# 5b. SIGUSR1: a flight-recorder dump, and forwarded only to a worker that handles it. Local
#     rank 0 traps USR1; rank 1 does not, so USR1 would kill it (exit 138 fails the job).
cat >"$T/usr1.sh" <<'SH'
[ "$LOCAL_RANK" = 0 ] && trap 'echo "$LOCAL_RANK got USR1" >> "$OUT"' USR1
echo "$LOCAL_RANK up" >> "$OUT"
while [ ! -e "$GO" ]; do sleep 0.05; done
SH
export OUT="$T/usr1.log" GO="$T/usr1.go"
"$AGENT" --http-port -1 --standalone --nproc-per-node 2 --monitor-interval 0.05 -- bash "$T/usr1.sh" \
  >/dev/null 2>"$T/u.err" &
apid=$!
for _ in $(seq 100); do [ "$(grep -c up "$T/usr1.log" 2>/dev/null)" = 2 ] && break; sleep 0.1; done
kill -USR1 $apid
for _ in $(seq 50); do grep -q 'got USR1' "$T/usr1.log" 2>/dev/null && break; sleep 0.1; done
touch "$GO"
for _ in $(seq 300); do kill -0 $apid 2>/dev/null || break; sleep 0.1; done
kill -KILL $apid 2>/dev/null; wait $apid; rc=$?
[ $rc -eq 0 ] && [ "$(grep -c 'got USR1' "$T/usr1.log")" = 1 ] && grep -q '^0 got USR1' "$T/usr1.log" &&
  grep -q "forwarded to 1 of 2 worker(s)" "$T/u.err" &&
  grep -q "flight recorders of this node's ranks (SIGUSR1) written to" "$T/u.err" &&
  pass "SIGUSR1: dump written, forwarded to the worker with a handler only, job completed" ||
  fail "SIGUSR1: exit $rc, $(cat "$T/usr1.log" | tr '\n' ' '); $(grep -E 'USR1|E ' "$T/u.err" | head -3)"

# 6. As PID 1: the agent itself is PID 1 of a new pid namespace (unshare --fork execs it), so it
#    runs its PID 1 path (no subreaper: orphans are its children by the kernel's rule).
#    a) the worker's own background children, orphaned when their subshells exit, are re-parented
#       to PID 1 and reaped by it (gone, not zombies); the worker's exit code (5) passes through;
#    b) signals reach it although PID 1 gets no default action (a plain program there ignores
#       SIGTERM): SIGHUP forwarded and the job goes on, then SIGTERM forwarded, the agent exits 143.
cat >"$T/pid1.sh" <<'SH'
echo "pid1 $(cat /proc/1/comm)" >> "$OUT"
# The orphans live until the parent checks are done (a fixed sleep lost that race on a loaded
# machine), then exit; each gets 10 s to be reaped.
for i in 1 2 3 4 5; do (bash -c 'while [ ! -e "$OUT.go" ]; do sleep 0.05; done' & echo "orphan $!" >> "$OUT"); done
for p in $(sed -n 's/^orphan //p' "$OUT"); do echo "ppid $p $(ps -o ppid= -p "$p" | tr -d ' ')" >> "$OUT"; done
touch "$OUT.go"
for p in $(sed -n 's/^orphan //p' "$OUT"); do
  for _ in $(seq 200); do [ -e "/proc/$p" ] || break; sleep 0.05; done
  if [ -e "/proc/$p" ]; then echo "left $p $(cut -d' ' -f3 "/proc/$p/stat")" >> "$OUT"; else echo "reaped $p" >> "$OUT"; fi
done
[ "$MODE" = exit ] && exit 5
trap 'echo "got HUP" >> "$OUT"' HUP
trap 'echo "got TERM" >> "$OUT"; exit 0' TERM
echo up >> "$OUT"
while :; do sleep 0.05; done
SH
export OUT="$T/pid1.log" MODE=exit
bounded 60 unshare --pid --fork --mount-proc "$AGENT" --http-port -1 --monitor-interval 0.05 \
  --standalone --nproc-per-node 1 -- bash "$T/pid1.sh" >/dev/null 2>"$T/p1.err"; rc=$?
[ "$(sed -n 's/^pid1 //p' "$OUT")" = tdist-agent ] && pass "the agent is PID 1 in its pid namespace" ||
  fail "PID 1 is '$(sed -n 's/^pid1 //p' "$OUT")', want tdist-agent"
[ $rc -eq 5 ] && pass "as PID 1: worker exit code 5 passed through" || fail "PID 1 exit $rc ($(tail -3 "$T/p1.err"))"
[ "$(grep -c '^ppid [0-9]* 1$' "$OUT")" = 5 ] && [ "$(grep -c '^reaped ' "$OUT")" = 5 ] &&
  ! grep -q '^left ' "$OUT" &&
  pass "as PID 1: 5 orphaned grandchildren re-parented to the agent and reaped (no zombies)" ||
  fail "as PID 1, orphans: $(tr '\n' ' ' <"$OUT")"
export OUT="$T/pid1b.log" MODE=signals
unshare --pid --fork --mount-proc "$AGENT" --http-port -1 --monitor-interval 0.05 \
  --stop-grace-period 3 --standalone --nproc-per-node 1 -- bash "$T/pid1.sh" >/dev/null 2>"$T/p1b.err" &
upid=$!
wait_lines "$OUT" '^up$' 1
a1="$(pgrep -P $upid)"
[ -n "$a1" ] && [ "$(awk '/^NSpid:/ {print $NF}' "/proc/$a1/status")" = 1 ] ||
  fail "as PID 1: no agent with pid 1 in its namespace under unshare ($a1)"
kill -HUP "$a1"; wait_lines "$OUT" '^got HUP$' 1
kill -TERM "$a1"; wait $upid; rc=$?
grep -q '^got HUP$' "$OUT" && grep -q "forwarding Hangup to the workers" "$T/p1b.err" &&
  pass "as PID 1: SIGHUP received and forwarded, the job went on" ||
  fail "as PID 1, SIGHUP: $(tr '\n' ' ' <"$OUT") $(grep -E 'forwarding|received' "$T/p1b.err")"
[ $rc -eq 143 ] && grep -q '^got TERM$' "$OUT" && pass "as PID 1: SIGTERM forwarded, agent exits 143" ||
  fail "as PID 1, SIGTERM: exit $rc, $(tr '\n' ' ' <"$OUT")"

# 7. HTTP while a job runs (its workers wait before init, so none has reached its store yet):
#    /healthz /readyz /metrics (promtool) /status, 404/405.
rm -f "$T/go"; mkdir -p "$T/http"
"$AGENT" --standalone --nproc-per-node 2 --http-port 0 --http-port-file "$T/port" --monitor-interval 0.05 \
  -- "$DDP" --wait-file "$T/go" >/dev/null 2>"$T/h.err" &
apid=$!
for _ in $(seq 100); do [ -s "$T/port" ] && break; sleep 0.05; done
P=$(cat "$T/port")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$P/status" | grep -q '"state": *"running"' && break; sleep 0.1; done
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/healthz")" = 200 ] && pass "/healthz 200" || fail "/healthz"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/readyz")" = 200 ] && pass "/readyz 200" || fail "/readyz"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/nope")" = 404 ] && pass "404" || fail "404"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$P/metrics")" = 405 ] && pass "405" || fail "405"
curl -s -D "$T/hdr" "http://127.0.0.1:$P/metrics" >"$T/metrics"
grep -qi '^content-type: text/plain; version=0.0.4' "$T/hdr" && pass "metrics content type" || fail "content type: $(cat "$T/hdr")"
promtool check metrics <"$T/metrics" >"$T/promtool" 2>&1 && pass "promtool check metrics" || fail "promtool: $(cat "$T/promtool")"
grep -q '^tdist_workers{state="running"} 2$' "$T/metrics" && grep -q '^tdist_store_clients ' "$T/metrics" &&
  grep -qE '^tdist_worker_store_clients [0-9]' "$T/metrics" && grep -qE '^tdist_worker_store_keys [0-9]' "$T/metrics" &&
  grep -q '^tdist_build_info{' "$T/metrics" && grep -q '^process_resident_memory_bytes ' "$T/metrics" &&
  pass "metrics values" || fail "metrics: $(grep -E '^tdist_(workers|store_clients)' "$T/metrics")"
curl -s "http://127.0.0.1:$P/status" >"$T/status.json"
if $PY -c '
import json,sys; s=json.load(open(sys.argv[1]))
assert s["state"]=="running", s; assert s["world_size"]==2 and len(s["workers"])==2, s
assert all(w["state"]=="running" and w["pid"]>0 for w in s["workers"]), s
assert [w["global_rank"] for w in s["workers"]]==[0,1], s
assert 0 < s["worker_master_port"] < 65536 and s["worker_master_port"] != s["master_port"], s' "$T/status.json"; then pass "/status JSON"; else fail "/status: $(cat "$T/status.json")"; fi
touch "$T/go"; wait $apid; rc=$?
[ $rc -eq 0 ] && pass "job under HTTP inspection completed" || fail "http job exit $rc"

# 7b. Restart accounting on /metrics: local rank 1 exits 3 on attempt 0, the group restarts, and
#     attempt 1 waits for a file while the test reads the counters.
rm -f "$T/port2" "$T/go2"
"$AGENT" --standalone --nproc-per-node 2 --max-restarts 1 --http-port 0 --http-port-file "$T/port2" \
  --monitor-interval 0.05 --stop-grace-period 3 -- sh -c \
  'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 1 ]; then exit 3; fi
   while [ ! -e "$0" ]; do sleep 0.05; done' "$T/go2" >/dev/null 2>"$T/h2.err" &
apid=$!
for _ in $(seq 100); do [ -s "$T/port2" ] && break; sleep 0.05; done
P=$(cat "$T/port2")
# The agent publishes attempt 1 when it joins the new round, and attempt 0's worker states until
# attempt 1's workers start: wait for both.
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$P/metrics" >"$T/metrics2" &&
    grep -q '^tdist_restart_attempt 1$' "$T/metrics2" &&
    grep -q '^tdist_workers{state="running"} 2$' "$T/metrics2" && break
  sleep 0.1
done
curl -s "http://127.0.0.1:$P/metrics" >"$T/metrics2"
grep -q '^tdist_restarts_total{reason="worker_failed"} 1$' "$T/metrics2" &&
  grep -q '^tdist_worker_exits_total{code_class="nonzero"} 1$' "$T/metrics2" &&
  grep -q '^tdist_worker_exits_total{code_class="signal"} 1$' "$T/metrics2" &&
  grep -q '^tdist_workers{state="running"} 2$' "$T/metrics2" &&
  pass "restart counted on /metrics (restarts_total, worker_exits_total, restart_attempt)" ||
  fail "restart metrics: $(grep -E '^tdist_(restart|worker_exits|workers)' "$T/metrics2")"
touch "$T/go2"; wait $apid; rc=$?
[ $rc -eq 0 ] && pass "restarted job completed" || fail "restarted job exit $rc"

# 8. Bad input: flags, env, YAML name what is wrong and exit 64.
"$AGENT" --nproc-per-node zero -- true 2>"$T/e1"; rc=$?
[ $rc -eq 64 ] && grep -q "nproc" "$T/e1" && pass "bad flag: exit 64, named" || fail "bad flag: $rc $(cat "$T/e1")"
PET_NNODES=3:2 "$AGENT" -- true 2>"$T/e2"; rc=$?
[ $rc -eq 64 ] && grep -q "PET_NNODES" "$T/e2" && pass "bad env: exit 64, named" || fail "bad env: $rc $(cat "$T/e2")"
printf 'nproc_per_node: 2\nmax_restarts: three\n' >"$T/bad.yaml"
"$AGENT" --config "$T/bad.yaml" -- true 2>"$T/e3"; rc=$?
[ $rc -eq 64 ] && grep -q "bad.yaml:2:" "$T/e3" && pass "bad YAML: exit 64, file:line named" || fail "bad YAML: $rc $(cat "$T/e3")"
"$AGENT" --help >"$T/help"; rc=$?
[ $rc -eq 0 ] && grep -q -- "--nproc-per-node" "$T/help" && pass "--help" || fail "--help ($rc)"
"$AGENT" --version >"$T/version"; rc=$?
[ $rc -eq 0 ] && grep -qE '^tdist-agent [0-9]+\.[0-9]+\.[0-9]+$' "$T/version" && pass "--version" || fail "--version"

agent_test_end standalone_test
