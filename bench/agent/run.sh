#!/usr/bin/env bash
# Agent benchmark: tdist-agent against PyTorch 1.13's torchrun, both measured in the same run,
# repetitions interleaved (the order alternates each repetition), medians printed in one table.
#
#   bash bench/agent/run.sh            5 repetitions, wrk 3 x 5 s (~3 min on 2 cores)
#   bash bench/agent/run.sh --quick    3 repetitions, wrk 1 x 2 s (~2 min)
#   bash bench/agent/run.sh --repeat 9 --wrk-duration 10s --wrk-repeat 5
#   bash bench/agent/run.sh --recovery [OPTIONS]   recovery time after a lost pod, with and
#                                      without warm spares: bench/agent/recovery.sh --help
#
# Measures, with stamp.c as the worker (it writes CLOCK_REALTIME ns to $OUTDIR/$LOCAL_RANK first
# thing in main) and launch_probe.c around the launcher (CLOCK_REALTIME right before exec):
#   launch  time until all N workers exec'd (standalone, N = 2 and 8, workers exit at once)
#   wall    time until the launcher exited 0 (same runs)
#   memory  peak RSS (VmHWM of /proc/<launcher>/status, sampled every 5 ms) and user+sys CPU of
#           the launcher, N = 8 workers that sleep 1 s
#   metrics wrk -t2 -c16 --latency on tdist-agent's /metrics (torchrun has none: n/a)
# torchrun is `/usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --no_python`:
# torchrun 1.13 crashes on Debian's Python 3.11 without --redirects/--tee. Builds with
# `bazel build -c opt`, copies the binaries to a temporary directory and runs them from there
# (not under `bazel run`: it must not hold the Bazel lock of this shared workspace, and a rebuild
# must not swap a binary mid-run). Nothing is left running: every launcher runs under
# launch_probe, a child subreaper that kills and reaps whatever the launcher leaves behind, and
# the EXIT trap stops the /metrics agent. Prints numbers; asserts nothing about speed.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/agent

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --quick               3 repetitions, wrk 1 x 2 s
  --repeat N            repetitions of every launcher run (default 5; --quick 3)
  --wrk-duration D      wrk -d per /metrics run (default 5s; --quick 2s)
  --wrk-repeat N        /metrics runs, median printed (default 3; --quick 1)
  --no-torch            skip torchrun (its column prints -)
  --recovery [OPTS]     run bench/agent/recovery.sh with the options after it instead
  --help                this text
EOF
}

quick=0 repeat="" wrk_dur="" wrk_rep="" use_torch=1
while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --repeat) repeat="${2:?--repeat needs a number}"; shift ;;
    --wrk-duration) wrk_dur="${2:?--wrk-duration needs a duration like 5s}"; shift ;;
    --wrk-repeat) wrk_rep="${2:?--wrk-repeat needs a number}"; shift ;;
    --no-torch) use_torch=0 ;;
    --recovery) shift; exec bash "$here/recovery.sh" "$@" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if ((quick)); then : "${repeat:=3}" "${wrk_dur:=2s}" "${wrk_rep:=1}"; fi
: "${repeat:=5}" "${wrk_dur:=5s}" "${wrk_rep:=3}"
for v in "$repeat" "$wrk_rep"; do
  [[ "$v" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "run.sh: bad count '$v': want 1..999" >&2; exit 2; }
done
[[ "$wrk_dur" =~ ^[1-9][0-9]*[smh]?$ ]] || { echo "run.sh: bad --wrk-duration '$wrk_dur'" >&2; exit 2; }

torch_py=/usr/bin/python3
if ((use_torch)) && ! "$torch_py" -c 'import torch.distributed.run' 2>/dev/null; then
  echo "run.sh: $torch_py cannot import torch.distributed.run: torchrun skipped" \
       "(apt-get install -y python3-torch)" >&2
  use_torch=0
fi
have_wrk=0
command -v wrk >/dev/null && have_wrk=1
((have_wrk)) || echo "run.sh: wrk not found: /metrics rows skipped (apt-get install -y wrk)" >&2

bazel build -c opt --color=no --curses=no //operator-agent:tdist-agent //bench/agent:stamp \
  //bench/agent:launch_probe </dev/null
# The bazel-bin symlink follows whichever configuration built last in this shared workspace;
# ask for the -c opt output directory instead.
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"

tmp="$(mktemp -d /tmp/agent_bench.XXXXXX)"
metrics_pid=""
# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$metrics_pid" ]] && kill -0 "$metrics_pid" 2>/dev/null; then
    kill -TERM "$metrics_pid" 2>/dev/null || true
    wait "$metrics_pid" 2>/dev/null || true
  fi
  # Belt and braces: a worker still alive is one of our stamp binaries (by its exe path).
  local f pid
  for f in "$tmp"/out/* "$tmp"/mout/*; do
    [[ -f "$f" ]] || continue
    read -r _ pid <"$f" || continue
    [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$tmp/bin/stamp" ]] && kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$tmp/bin" "$tmp/res" "$tmp/alog" "$tmp/tlog"
cp "$bin/operator-agent/tdist-agent" "$bin/$here/stamp" "$bin/$here/launch_probe" "$tmp/bin/"
agent="$tmp/bin/tdist-agent" stamp="$tmp/bin/stamp" probe="$tmp/bin/launch_probe"
export OMP_NUM_THREADS=1 # both launchers would set it (and torchrun would warn about it)

# run_one KIND N SLEEP_S SAMPLE_RSS: one launcher run; appends samples to $tmp/res/KIND.METRIC.
# KIND: tdist, torch, or torch-mi (torchrun with --monitor_interval 0.1). Returns 1 on failure
# after printing the launcher's last lines.
run_one() {
  local kind=$1 n=$2 sleep_s=$3 sample=$4 cmd
  local od="$tmp/out"
  rm -rf "$od" && mkdir -p "$od"
  case "$kind" in
    tdist) cmd=("$agent" --standalone --nproc-per-node "$n" --http-port -1 --log-dir "$tmp/alog") ;;
    torch|torch-mi)
      cmd=("$torch_py" -m torch.distributed.run --standalone --nproc_per_node "$n"
           --redirects 1 --tee 1 --log_dir "$tmp/tlog")
      [[ "$kind" == torch-mi ]] && cmd+=(--monitor_interval 0.1)
      cmd+=(--no_python) ;;
  esac
  cmd+=("$stamp" "$sleep_s")
  local popt=(--out "$tmp/probe" --timeout 300)
  ((sample)) && popt+=(--sample-rss)
  local t0 end status hwm maxrss cpu own_cpu orphans
  if ! OUTDIR="$od" "$probe" "${popt[@]}" -- "${cmd[@]}" >"$tmp/log" 2>&1 ||
     ! read -r t0 end status hwm maxrss cpu own_cpu orphans <"$tmp/probe" || ((status != 0)); then
    echo "run.sh: $kind N=$n failed (exit status ${status:-?}); last lines:" >&2
    tail -n 15 "$tmp/log" | sed 's/^/    /' >&2
    echo "$kind N=$n" >>"$tmp/failures"
    return 1
  fi
  ((orphans == 0)) || echo "$kind N=$n: $orphans process(es) outlived the launcher" >>"$tmp/orphans"
  local r last=0 first=0 ns _pid
  for ((r = 0; r < n; r++)); do
    if ! read -r ns _pid <"$od/$r" 2>/dev/null; then
      echo "run.sh: $kind N=$n exited 0 but worker $r never stamped $od/$r" >&2
      echo "$kind N=$n" >>"$tmp/failures"
      return 1
    fi
    ((ns > last)) && last=$ns
    ((first == 0 || ns < first)) && first=$ns
  done
  local tag="$kind.n$n"
  ((sample)) && tag+=".sleep"
  echo $((last - t0)) >>"$tmp/res/$tag.launch_ns"
  echo $((first - t0)) >>"$tmp/res/$tag.first_ns"
  echo $((end - t0)) >>"$tmp/res/$tag.wall_ns"
  if ((sample)); then
    echo "$hwm" >>"$tmp/res/$tag.hwm_kb"
    echo "$maxrss" >>"$tmp/res/$tag.maxrss_kb"
    echo "$cpu" >>"$tmp/res/$tag.cpu_us"
    ((own_cpu >= 0)) && echo "$own_cpu" >>"$tmp/res/$tag.own_cpu_us"
  fi
}

# median FILE: the median of the numbers in FILE, one a line (mean of the middle two when even);
# prints nothing when FILE is missing.
median() {
  [[ -s "$1" ]] || return 0
  sort -g "$1" | awk '{v[NR] = $1} END {
    if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

kinds=(tdist)
((use_torch)) && kinds+=(torch)
nprocs=(2 8)

echo "run.sh: warm-up (one untimed run of each launcher), then $repeat interleaved repetitions..." >&2
for k in "${kinds[@]}"; do run_one "$k" 2 0 0 || true; done
rm -rf "$tmp/res" "$tmp/failures" && mkdir -p "$tmp/res"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

for ((rep = 1; rep <= repeat; rep++)); do
  echo "run.sh: repetition $rep/$repeat" >&2
  order=("${kinds[@]}")
  if ((rep % 2 == 0)); then # alternate who goes first
    order=()
    for ((i = ${#kinds[@]} - 1; i >= 0; i--)); do order+=("${kinds[i]}"); done
  fi
  for n in "${nprocs[@]}"; do
    for k in "${order[@]}"; do run_one "$k" "$n" 0 0 || true; done
  done
  for k in "${order[@]}"; do run_one "$k" 8 1 1 || true; done
  ((use_torch)) && { run_one torch-mi 8 0 0 || true; }
done

# /metrics under load: 8 workers that sleep for an hour, the agent on an ephemeral port.
wrk_note=""
if ((have_wrk)); then
  echo "run.sh: /metrics: wrk -t2 -c16 -d$wrk_dur, $wrk_rep run(s)..." >&2
  mkdir -p "$tmp/mout"
  OUTDIR="$tmp/mout" "$probe" --out "$tmp/mprobe" --timeout 3600 -- "$agent" --standalone \
    --nproc-per-node 8 --http-host 127.0.0.1 --http-port 0 --http-port-file "$tmp/port" \
    --stop-grace-period 2 --log-dir "$tmp/alog" -- "$stamp" 3600 >"$tmp/mlog" 2>&1 &
  metrics_pid=$!
  port=""
  for ((i = 0; i < 200; i++)); do
    [[ -s "$tmp/port" ]] && port="$(cat "$tmp/port")" && [[ "$port" =~ ^[0-9]+$ ]] && break
    port=""
    kill -0 "$metrics_pid" 2>/dev/null || break
    sleep 0.05
  done
  if [[ -z "$port" ]]; then
    echo "run.sh: tdist-agent never wrote its HTTP port to $tmp/port; last lines:" >&2
    tail -n 15 "$tmp/mlog" | sed 's/^/    /' >&2
  else
    # The body once, for its size (bash's /dev/tcp: no curl needed).
    # shellcheck disable=SC2016 # $1 is for the inner bash
    metrics_bytes="$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
      printf "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 && cat <&3' _ "$port" |
      sed '1,/^\r$/d' | wc -c)" || metrics_bytes="?"
    for ((i = 1; i <= wrk_rep; i++)); do
      wrk -t2 -c16 -d"$wrk_dur" --latency "http://127.0.0.1:$port/metrics" >"$tmp/wrk.$i" 2>&1 || true
      # wrk prints latencies with a unit (us, ms, s); convert to µs.
      awk -v res="$tmp/res" '
        function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000;
                         if (v ~ /s$/) return v * 1e6; return v + 0 }
        $1 == "50%" { print us($2) >> (res "/wrk.p50_us") }
        $1 == "99%" { print us($2) >> (res "/wrk.p99_us") }
        $1 == "Requests/sec:" { print $2 >> (res "/wrk.rps") }
        /Non-2xx|Socket errors/ { bad = bad $0 " " }
        END { if (bad != "") print bad > (res "/wrk.errors") }' "$tmp/wrk.$i"
      [[ -s "$tmp/res/wrk.errors" ]] && wrk_note+="run $i: $(cat "$tmp/res/wrk.errors"); "
      rm -f "$tmp/res/wrk.errors"
    done
  fi
  kill -TERM "$metrics_pid" 2>/dev/null || true
  wait "$metrics_pid" 2>/dev/null || true
  metrics_pid=""
  if read -r _ _ _ _ _ _ _ m_orphans <"$tmp/mprobe" 2>/dev/null && ((m_orphans)); then
    echo "tdist /metrics run: $m_orphans process(es) outlived the agent after SIGTERM" >>"$tmp/orphans"
  fi
fi
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- table ----
# cell FILE SCALE [DECIMALS]: median of FILE divided by SCALE (1 decimal by default); "-" when
# there is no sample.
cell() {
  local m
  m="$(median "$1")"
  if [[ -z "$m" ]]; then echo "-"; else
    awk -v m="$m" -v s="$2" -v d="${3:-1}" 'BEGIN { printf "%.*f", d, m / s }'; fi
}
ratio() { # ratio A B: B / A (torchrun / tdist-agent), 2 decimals
  if [[ "$1" == - || "$2" == - || "$2" == n/a ]]; then echo "-"; else
    awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }'; fi
}
row() { # row LABEL TDIST TORCH [RATIO]
  local r="${4:-$(ratio "$2" "$3")}"
  printf "%-46s %12s %12s %8s\n" "$1" "$2" "$3" "$r"
}
tcol() { if ((use_torch)); then cell "$tmp/res/$1" "$2"; else echo "-"; fi; }

cpu_model="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
agent_version="$("$agent" --version 2>&1 | head -n 1)"
torch_version="-"
((use_torch)) && torch_version="$("$torch_py" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
py_version="$("$torch_py" --version 2>&1)"
wrk_version="-"
# wrk --version prints its banner and exits 1.
((have_wrk)) && wrk_version="$( (wrk --version 2>&1 || true) | awk 'NR == 1 {print $2}')"

echo
echo "# agent_bench: $agent_version vs torchrun (PyTorch $torch_version, $py_version), median of $repeat interleaved repetitions$( ((quick)) && echo " (--quick)")"
echo "# machine: $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) CPUs, ${cpu_model:-unknown CPU}, Linux $(uname -r); load average before $load_before, after $load_after"
echo "# tdist-agent: tdist-agent --standalone --nproc-per-node N --http-port -1 -- stamp S"
echo "# torchrun:    $torch_py -m torch.distributed.run --standalone --nproc_per_node N --redirects 1 --tee 1 --no_python stamp S"
echo "#              (--redirects 1 --tee 1 on every torchrun run: without them torchrun 1.13 crashes on Python 3.11, AttributeError in to_map)"
echo "# launch = CLOCK_REALTIME right before exec of the launcher -> the last of N workers exec'd; wall = -> the launcher exited 0"
echo "# monitor interval: tdist-agent 0.1 s, torchrun 5 s by default (its wall time is mostly that); one row reruns torchrun with 0.1"
echo "# memory/CPU: N=8 workers sleeping 1 s; peak RSS = the launcher's VmHWM (sampled every 5 ms; tdist-agent: its guard's + the agent's); CPU = user+sys of the launcher"
echo "#             alone (all threads, 10 ms ticks) and of the launcher plus its 8 workers (rusage)"
echo "# /metrics: wrk $wrk_version -t2 -c16 -d$wrk_dur --latency, 8 workers sleeping, ${metrics_bytes:-?} B body, median of $wrk_rep; torchrun has no metrics endpoint: n/a"
echo "# ratio = torchrun / tdist-agent for times and memory: > 1 means tdist-agent is faster / smaller"
echo "#"
printf "%-46s %12s %12s %8s\n" "# metric" "tdist-agent" "torchrun" "ratio"
for n in "${nprocs[@]}"; do
  row "launch N=$n, all workers exec'd (ms)" "$(cell "$tmp/res/tdist.n$n.launch_ns" 1e6)" \
      "$(tcol "torch.n$n.launch_ns" 1e6)"
done
row "launch N=8, first worker exec'd (ms)" "$(cell "$tmp/res/tdist.n8.first_ns" 1e6)" \
    "$(tcol "torch.n8.first_ns" 1e6)"
for n in "${nprocs[@]}"; do
  row "wall N=$n, launcher exit 0 (ms)" "$(cell "$tmp/res/tdist.n$n.wall_ns" 1e6)" \
      "$(tcol "torch.n$n.wall_ns" 1e6)"
done
row "wall N=8, torchrun --monitor_interval 0.1 (ms)" "$(cell "$tmp/res/tdist.n8.wall_ns" 1e6)" \
    "$(tcol "torch-mi.n8.wall_ns" 1e6)"
row "peak RSS N=8, launcher VmHWM (MiB)" "$(cell "$tmp/res/tdist.n8.sleep.hwm_kb" 1024)" \
    "$(tcol "torch.n8.sleep.hwm_kb" 1024)"
row "CPU N=8 sleep 1 s, launcher alone (ms)" "$(cell "$tmp/res/tdist.n8.sleep.own_cpu_us" 1000)" \
    "$(tcol "torch.n8.sleep.own_cpu_us" 1000)"
row "CPU N=8 sleep 1 s, launcher + workers (ms)" "$(cell "$tmp/res/tdist.n8.sleep.cpu_us" 1000)" \
    "$(tcol "torch.n8.sleep.cpu_us" 1000)"
row "wall N=8 sleep 1 s, launcher exit 0 (ms)" "$(cell "$tmp/res/tdist.n8.sleep.wall_ns" 1e6)" \
    "$(tcol "torch.n8.sleep.wall_ns" 1e6)"
if ((have_wrk)); then
  row "/metrics throughput (req/s)" "$(cell "$tmp/res/wrk.rps" 1)" n/a n/a
  row "/metrics latency p50 (ms)" "$(cell "$tmp/res/wrk.p50_us" 1000 3)" n/a n/a
  row "/metrics latency p99 (ms)" "$(cell "$tmp/res/wrk.p99_us" 1000 3)" n/a n/a
fi
[[ -s "$tmp/failures" ]] && echo "# failed runs (left out of the medians): $(sort "$tmp/failures" | uniq -c | awk '{ $1 = $1 "x"; print }' | paste -sd ';' -)"
[[ -s "$tmp/orphans" ]] && echo "# left behind (killed by launch_probe): $(paste -sd ';' "$tmp/orphans")"
[[ -n "$wrk_note" ]] && echo "# wrk errors: $wrk_note"
exit 0
