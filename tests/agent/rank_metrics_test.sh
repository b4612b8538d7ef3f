#!/usr/bin/env bash
# Per-rank process metrics and the hang detector for workers that do not run libtdist (issue
# 37), over a real agent and real processes (rank_proc_worker: plain C, no libtdist). One agent,
# 4 workers; rank 3 exits at once, ranks 0-2 touch 48 MiB, write 300,000 bytes, start 3 threads
# and wait on a FIFO. Checked:
#   a. /metrics has the tdist_rank_* series of ranks 0-2 and none of rank 3; each value against
#      the test's own reading of /proc and ps: threads (>= 4 and = NLWP), resident memory (>= 48
#      MiB, within 2 MiB of VmRSS), bytes written (= /proc/PID/io wchar, >= 300,000), CPU seconds
#      (within 0.05 s of /proc/PID/stat), state S, context switches; promtool check metrics
#      passes; tdist_agent_sample_seconds_total is there;
#   b. NVML absent (TDIST_NVML_LIBRARY names a missing file): one log line, /status
#      gpu_monitoring {available false, reason naming the library}, no tdist_rank_gpu_* series;
#   c. every rank waiting (CPU flat) is not a hang: /status "hang" is null;
#   d. rank 1 stopped (SIGSTOP): /status names it, reason "stopped", ranks 0 and 2 waiting, with
#      every thread (comm, state, wchan: the FIFO wait); tdist_rank_stalled{reason="stopped"} 1
#      and tdist_rank_process_state{state="T"} 1 for rank 1 only;
#   e. rank 1 continued and spinning (SIGUSR2): named again, reason "spinning";
#   f. a second agent with TDIST_PROGRESS_DEADLINE_SECONDS=2 and the stall threshold out of
#      reach: the waiting ranks are named with reason "deadline".
# Stall threshold 2 s. Each wait has a deadline (no timed assertion). About 20 s.
#   args: AGENT WORKER
set -uo pipefail
AGENT="$(realpath "$1")"; WORKER="$(realpath "$2")"
PY=/usr/bin/python3
T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/rankmetrics.XXXXXX")"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_kill_all
cleanup() {
  agent_kill_all
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
for tool in "$PY" promtool curl ps; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found"; exit 1; }
done
export TDIST_LOG_LEVEL=info TDIST_STALL_REPORT_SECONDS=2 TDIST_NVML_LIBRARY="$T/no-such/libnvidia-ml.so.1"

# start_agent NAME: an agent with 4 rank_proc_worker workers in $T/NAME (port in $T/NAME/port).
start_agent() {
  mkdir -p "$T/$1" && mkfifo "$T/$1/fifo"
  "$AGENT" --standalone --nproc-per-node 4 --http-port 0 --http-port-file "$T/$1/port" \
    --log-dir "$T/$1" --stop-grace-period 2 -- "$WORKER" 48 300000 3 "$T/$1" 3 \
    >"$T/$1/out" 2>"$T/$1/err" &
  agent_started $!
}
# get NAME PATH: the agent's answer on PATH ("" until it answers).
get() {
  local p
  p="$(cat "$T/$1/port" 2>/dev/null)" || return 0
  [ -n "$p" ] && curl -sf --max-time 5 "http://127.0.0.1:$p$2" 2>/dev/null
}
# wait_for SECS CMD...: 0 once CMD succeeds (tried every 0.2 s), 1 after SECS seconds.
wait_for() {
  local end=$((SECONDS + $1))
  shift
  while [ $SECONDS -lt $end ]; do "$@" && return 0; sleep 0.2; done
  return 1
}
ready() { [ -e "$T/$1/ready.0" ] && [ -e "$T/$1/ready.1" ] && [ -e "$T/$1/ready.2" ]; }
# pid NAME RANK: the worker's pid from /status.
pid() {
  get "$1" /status | $PY -c '
import json, sys
for w in json.load(sys.stdin)["workers"]:
    if w["global_rank"] == int(sys.argv[1]): print(w["pid"])' "$2"
}
# hang_is NAME RANK REASON: /status names RANK with REASON (its JSON saved in $T/NAME/hang.json).
hang_is() {
  get "$1" /status >"$T/$1/status.json" || return 1
  $PY - "$T/$1/status.json" "$2" "$3" "$T/$1/hang.json" <<'PYEOF'
import json, sys
h = json.load(open(sys.argv[1])).get("hang")
json.dump(h, open(sys.argv[4], "w"))
sys.exit(0 if h and h["rank"] == int(sys.argv[2]) and h["reason"] == sys.argv[3] else 1)
PYEOF
}

start_agent a
wait_for 30 ready a || { fail "the workers are not ready after 30 s: $(tail -5 "$T/a/err")"; exit 1; }
P=()
for r in 0 1 2; do P[r]="$(pid a $r)"; done
# a sample after the workers are ready: the monitor interval is 0.1 s
sleep 0.5
get a /metrics >"$T/a/metrics.txt"

# ---- a. every series against the test's own reading ----
if $PY - "$T/a/metrics.txt" "${P[0]}" "${P[1]}" "${P[2]}" <<'PYEOF'; then pass "a. rank series match /proc and ps"; else fail "a. rank series"; fi
import os, re, subprocess, sys
text = open(sys.argv[1]).read()
pids = sys.argv[2:5]
hz = os.sysconf("SC_CLK_TCK")
m = {}
for line in text.splitlines():
    if line.startswith("#") or not line.strip():
        continue
    name_labels, value = line.rsplit(" ", 1)
    m[name_labels] = float(value)
def get(name, rank, extra=""):
    key = '%s{rank="%d",local_rank="%d"%s}' % (name, rank, rank, extra)
    if key not in m:
        raise SystemExit("missing " + key)
    return m[key]
bad = []
for rank in range(3):
    pid = pids[rank]
    status = open("/proc/%s/status" % pid).read()
    fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
    vmrss = int(fields["VmRSS"].split()[0]) * 1024
    threads = int(fields["Threads"])
    io = dict(l.split(": ") for l in open("/proc/%s/io" % pid).read().splitlines())
    stat = open("/proc/%s/stat" % pid).read()
    after = stat[stat.rindex(")") + 2:].split()
    cpu_user, cpu_sys = int(after[11]) / hz, int(after[12]) / hz
    ps = subprocess.run(["ps", "-o", "nlwp=,rss=", "-p", pid], capture_output=True, text=True).stdout.split()
    checks = [
        # 3 started + main (+ a sanitizer's own thread where the worker is built with one)
        ("threads", get("tdist_rank_threads", rank), threads >= 4 and int(ps[0]) == threads and get("tdist_rank_threads", rank) == threads),
        ("rss", get("tdist_rank_resident_memory_bytes", rank), get("tdist_rank_resident_memory_bytes", rank) >= 48 << 20 and abs(get("tdist_rank_resident_memory_bytes", rank) - vmrss) <= 2 << 20 and abs(int(ps[1]) * 1024 - vmrss) <= 2 << 20),
        ("write", get("tdist_rank_io_bytes_total", rank, ',direction="write"'), get("tdist_rank_io_bytes_total", rank, ',direction="write"') == int(io["wchar"]) and int(io["wchar"]) >= 300000),
        ("read", get("tdist_rank_io_bytes_total", rank, ',direction="read"'), get("tdist_rank_io_bytes_total", rank, ',direction="read"') <= int(io["rchar"])),
        ("cpu user", get("tdist_rank_cpu_seconds_total", rank, ',mode="user"'), abs(get("tdist_rank_cpu_seconds_total", rank, ',mode="user"') - cpu_user) <= 0.05),
        ("cpu system", get("tdist_rank_cpu_seconds_total", rank, ',mode="system"'), abs(get("tdist_rank_cpu_seconds_total", rank, ',mode="system"') - cpu_sys) <= 0.05),
        ("state S", get("tdist_rank_process_state", rank, ',state="S"'), get("tdist_rank_process_state", rank, ',state="S"') == 1 and get("tdist_rank_process_state", rank, ',state="R"') == 0),
        ("context switches", get("tdist_rank_context_switches_total", rank, ',kind="voluntary"'), get("tdist_rank_context_switches_total", rank, ',kind="voluntary"') >= 1),
    ]
    for what, got, ok in checks:
        print("rank %d %s: %s %s" % (rank, what, got, "ok" if ok else "MISMATCH"))
        if not ok:
            bad.append((rank, what))
if re.search(r'^tdist_rank_\w+\{rank="3"', text, re.M):
    bad.append("rank 3 exited but has series")
if "tdist_agent_sample_seconds_total" not in text:
    bad.append("no tdist_agent_sample_seconds_total")
print("bad:", bad)
sys.exit(1 if bad else 0)
PYEOF
if promtool check metrics <"$T/a/metrics.txt" >"$T/a/promtool.txt" 2>&1; then pass "a. promtool check metrics"; else fail "a. promtool: $(head -5 "$T/a/promtool.txt")"; fi

# ---- b. NVML absent ----
n=$(grep -c "GPU monitoring not available: cannot load $T/no-such/libnvidia-ml.so.1" "$T/a/err")
gpu=$(get a /status | $PY -c 'import json,sys; g=json.load(sys.stdin)["gpu_monitoring"]; print(g["available"], g["reason"])')
if [ "$n" = 1 ] && [[ "$gpu" == "False cannot load $T/no-such/libnvidia-ml.so.1"* ]] &&
  ! grep -q '^tdist_rank_gpu_' "$T/a/metrics.txt"; then
  pass "b. NVML absent: one log line, /status says why ($gpu)"
else
  fail "b. NVML absent: $n log line(s), gpu_monitoring '$gpu'"
fi

# ---- c. all waiting: no hang ----
h=$(get a /status | $PY -c 'import json,sys; print(json.load(sys.stdin)["hang"])')
if [ "$h" = None ]; then pass "c. every rank waiting is not a hang"; else fail "c. hang while all wait: $h"; fi

# ---- d. a stopped rank ----
kill -STOP "${P[1]}"
if wait_for 30 hang_is a 1 stopped; then
  if $PY - "$T/a/hang.json" <<'PYEOF'; then pass "d. stopped rank 1 named, peers 0 and 2 waiting, threads listed"; else fail "d. hang report: $(cat "$T/a/hang.json")"; fi
import json, sys
h = json.load(open(sys.argv[1]))
print(h["detail"])
roles = {r["rank"]: r for r in h["ranks"]}
assert roles[1]["role"] == "holding" and roles[1]["state"] == "T", roles[1]
assert roles[0]["role"] == "waiting" and roles[2]["role"] == "waiting", roles
for r in h["ranks"]:
    assert r["threads_total"] >= 4 and len(r["threads"]) == r["threads_total"], r
    comms = sorted(t["comm"] for t in r["threads"])
    assert [c for c in comms if c.startswith("rpw-")] == ["rpw-0", "rpw-1", "rpw-2"], comms
    main = r["threads"][0]
    print(r["rank"], r["role"], main["comm"], main["state"], main["wchan"])
    assert "wchan" in main and main["state"] == ("T" if r["rank"] == 1 else "S"), main
assert h["since_unix"] > 0
PYEOF
  get a /metrics >"$T/a/metrics2.txt"
  stalled=$(grep '^tdist_rank_stalled{' "$T/a/metrics2.txt")
  if [ "$stalled" = 'tdist_rank_stalled{rank="1",local_rank="1",reason="stopped"} 1' ] &&
    grep -q '^tdist_rank_process_state{rank="1",local_rank="1",state="T"} 1$' "$T/a/metrics2.txt"; then
    pass "d. tdist_rank_stalled names rank 1 only"
  else
    fail "d. stalled series: '$stalled'"
  fi
else
  fail "d. rank 1 stopped is not named within 30 s: $(cat "$T/a/hang.json")"
fi

# ---- e. the same rank spinning ----
kill -USR2 "${P[1]}"
kill -CONT "${P[1]}"
if wait_for 30 hang_is a 1 spinning; then
  pass "e. spinning rank 1 named: $($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["detail"])' "$T/a/hang.json")"
else
  fail "e. rank 1 spinning is not named within 30 s: $(cat "$T/a/hang.json")"
fi
kill -TERM "$APID"
wait "$APID"
rc=$?
left=$(pgrep -f "$WORKER" | wc -l)
if [ "$rc" = 143 ] && [ "$left" = 0 ]; then
  pass "agent a exits 143, no worker left"
else
  fail "agent a: exit $rc, $left worker(s) left"
fi

# ---- f. the user's deadline ----
TDIST_PROGRESS_DEADLINE_SECONDS=2 TDIST_STALL_REPORT_SECONDS=3600 start_agent f
if wait_for 30 ready f && wait_for 30 hang_is f 0 deadline; then
  pass "f. deadline: $($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["detail"])' "$T/f/hang.json")"
else
  fail "f. no deadline report: $(cat "$T/f/hang.json" 2>/dev/null)"
fi
kill -TERM "$APID"
wait "$APID"
agent_test_end rank_metrics_test
