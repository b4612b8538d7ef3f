#!/usr/bin/env bash
# Overhead of the agent's per-rank process sampling (operator-agent/procstat/, issue 37): what
# sampling every worker's /proc at the monitor interval costs the agent, and whether a training
# job notices it. Prints two tables; asserts nothing.
#
#   bash bench/agent/rank_metrics.sh                   N = 8 and 32 sleeping workers, 20 s each;
#                                                      the C example job 3 times each way
#   bash bench/agent/rank_metrics.sh --ranks "8 64" --seconds 30 --repeats 5
#
# 1. Agent CPU per rank per sample: tdist-agent --standalone with N workers that sleep, the
#    default --monitor-interval (0.1 s), with sampling (TDIST_RANK_METRICS=1, the default) and
#    without (0), one after the other. Over the same window (after the workers started) the
#    agent's own CPU time (utime+stime of /proc/AGENT/stat) and the sampler's own counter
#    (tdist_agent_sample_seconds_total, thread CPU time around each sample). Per rank per
#    sample = CPU / (samples x N), samples = window / 0.1 s.
# 2. Step time of a job: examples/train/train (2 ranks, gloo, 20000 steps, no sleeps) under the
#    agent with and without sampling, alternated; step time = (agent exit - first step) / steps.
set -euo pipefail
cd "$(dirname "$0")/../.."

ranks="8 32" seconds=20 repeats=3 steps=20000
while (($#)); do
  case "$1" in
    --ranks) ranks="${2:?--ranks needs a list}"; shift ;;
    --seconds) seconds="${2:?--seconds needs a number}"; shift ;;
    --repeats) repeats="${2:?--repeats needs a number}"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "rank_metrics.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

tmp="$(mktemp -d)"
apid=""
cleanup() {
  if [ -n "$apid" ]; then kill -KILL "$apid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

build() {
  bazel build -c opt --color=no --curses=no //operator-agent:tdist-agent //examples/train:train \
    </dev/null >"$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; exit 1; }
  bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
  cp "$bin/operator-agent/tdist-agent" "$bin/examples/train/train" "$tmp/"
}

# cpu_s PID: user + system CPU seconds of the process.
cpu_s() {
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat"
}

# sampled PORT: tdist_agent_sample_seconds_total (0 when the agent does not sample).
sampled() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk '$1 == "tdist_agent_sample_seconds_total" { v = $2 } END { print v + 0 }'
}

# agent_cost N ON: prints "agent_cpu_s sampler_cpu_s window_s" for N sleeping workers.
agent_cost() {
  local n=$1 on=$2 port agent c0 s0 c1 s1 t0 t1
  rm -f "$tmp/port"
  TDIST_RANK_METRICS=$on "$tmp/tdist-agent" --standalone --nproc-per-node "$n" --http-port 0 \
    --http-port-file "$tmp/port" --log-dir "$tmp" -- sleep 100000 >/dev/null 2>"$tmp/agent.err" &
  apid=$!
  for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  port="$(cat "$tmp/port")"
  sleep 2 # the workers started
  # the pid started is the guard (operator-agent/supervisor/guard.h); the agent is its child
  agent="$(pgrep -P "$apid" | head -1)"
  c0="$(cpu_s "$agent")" s0="$(sampled "$port")" t0="$(date +%s.%N)"
  sleep "$seconds"
  c1="$(cpu_s "$agent")" s1="$(sampled "$port")" t1="$(date +%s.%N)"
  kill -TERM "$apid"
  wait "$apid" || true
  apid=""
  echo "$(echo "$c1 - $c0" | bc -l) $(echo "$s1 - $s0" | bc -l) $(echo "$t1 - $t0" | bc -l)"
}

# step_ms ON: the train job's mean step time in ms, with sampling ON (1) or not (0).
step_ms() {
  local on=$1 first end
  rm -f "$tmp/events"
  TDIST_RANK_METRICS=$on "$tmp/tdist-agent" --standalone --nproc-per-node 2 --http-port 0 \
    --log-dir "$tmp" -- "$tmp/train" --steps "$steps" --print-every 0 --events "$tmp/events" \
    >/dev/null 2>"$tmp/train.err" || { tail -5 "$tmp/train.err" >&2; return 1; }
  end="$(date +%s.%N)"
  first="$(awk '{ print $4 }' "$tmp/events" | sort -n | head -1)"
  echo "($end - $first) * 1000 / $steps" | bc -l
}

build
hz="$(getconf CLK_TCK)"
echo "tdist-agent per-rank sampling: $(nproc) CPUs, $(uname -r), monitor interval 0.1 s, CLK_TCK $hz"
echo
printf '%6s %8s %16s %16s %18s %18s\n' ranks samples "agent CPU on s" "agent CPU off s" \
  "(on-off)/rank/smp" "sampler/rank/smp"
for n in $ranks; do
  read -r con son won < <(agent_cost "$n" 1)
  read -r coff _ woff < <(agent_cost "$n" 0)
  samples="$(echo "$won / 0.1" | bc -l)"
  printf '%6d %8.0f %16.3f %16.3f %15.1f us %15.1f us\n' "$n" "$samples" "$con" \
    "$(echo "$coff * $won / $woff" | bc -l)" \
    "$(echo "($con - $coff * $won / $woff) * 1000000 / ($samples * $n)" | bc -l)" \
    "$(echo "$son * 1000000 / ($samples * $n)" | bc -l)"
done
echo
echo "step time of examples/train/train, 2 ranks, $steps steps (ms per step; alternated):"
printf '%8s %14s %14s\n' repeat "sampling on" "sampling off"
for r in $(seq "$repeats"); do
  if [ $((r % 2)) = 1 ]; then
    on="$(step_ms 1)" off="$(step_ms 0)"
  else
    off="$(step_ms 0)" on="$(step_ms 1)"
  fi
  printf '%8d %14.4f %14.4f\n' "$r" "$on" "$off"
done
