#!/usr/bin/env bash
# Recovery benchmark: seconds from losing a pod mid-training to the first completed training step
# of the next attempt, with and without a warm spare (tdist-agent --spares), in one run, the
# configurations interleaved within each repetition, medians printed in one table at the end.
#
#   bash bench/agent/recovery.sh                 3 runs of every row (~12 min on 2 cores)
#   bash bench/agent/recovery.sh --runs 5 --delay 20 --torch 2.6
#   bash bench/agent/run.sh --recovery [OPTIONS] the same
#
# The cluster: pods in network namespaces (tests/agent/pods/pods.sh, dnsmasq as the cluster DNS,
# Indexed Job names job-0, job-1, ...), a 3-node job, one worker per pod, each pod running
# tdist-agent --nnodes 3 --spares S (S = 0 or 1) with --heartbeat-interval 0.5 and
# --heartbeat-timeout T (default 3 s). The workers are the C example (examples/train, --step-ms 20)
# or PyTorch DDP (examples/torch/ddp_train.py, --step-sleep 0.02; PyTorch 1.13 unless --torch 2.6).
# Once every rank finished its first step, one pod is lost the way a node is: its network cut
# (eth0 down: the peers see no FIN, only silence), then SIGKILL to everything in it. The victim
# is a member (job-1) or pod 0 (job-0, which hosts the store). Its replacement pod (same name, new
# IP, as a rescheduled pod) starts D seconds after the loss (--delay, default 10 s: scheduling
# plus image pull, simulated).
# Measured, from the workers' --events files and a time stamp the worker command writes right
# before it execs the worker:
#   recovery  loss -> the last of the 3 ranks completed the first step of the next attempt
#   launch    loss -> the last of the 3 workers of the next attempt was exec'd (the agents' part;
#             the rest is the worker's own start: process group, model, first step)
# A run that has not recovered 120 s after the loss counts as failed (its logs stay in the
# temporary directory). Needs root (network namespaces). Prints numbers; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=3 delay=10 hb_timeout=3 torch=1.13 workers="c torch" victims="1 0" spare_counts="0 1"
while (($#)); do
  case "$1" in
    --runs) runs="${2:?--runs needs a number}"; shift ;;
    --delay) delay="${2:?--delay needs seconds}"; shift ;;
    --heartbeat-timeout) hb_timeout="${2:?--heartbeat-timeout needs seconds}"; shift ;;
    --torch) torch="${2:?--torch needs 1.13 or 2.6}"; shift ;;
    --workers) workers="${2:?--workers needs c, torch or 'c torch'}"; shift ;;
    --victims) victims="${2:?--victims needs 1, 0 or '1 0'}"; shift ;;
    --spares) spare_counts="${2:?--spares needs counts like '0 1'}"; shift ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      cat <<'EOF'

Options:
  --runs N               repetitions of every row (default 3)
  --delay D              seconds from the loss to the replacement pod's start (default 10)
  --heartbeat-timeout T  the agents' --heartbeat-timeout in seconds (default 3)
  --torch V              PyTorch of the DDP rows: 1.13 (/usr/bin/python3, default) or 2.6
  --workers W            c, torch or "c torch" (default)
  --victims V            the pods lost: 1 (a member), 0 (the store host) or "1 0" (default)
  --spares S             spare counts to run, 0..2 each (default "0 1")
  --help                 this text
EOF
      exit 0 ;;
    *) echo "recovery.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$runs" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "recovery.sh: bad --runs '$runs': want 1..999" >&2; exit 2; }
[[ "$delay" =~ ^[0-9]{1,3}$ ]] || { echo "recovery.sh: bad --delay '$delay': want 0..999 seconds" >&2; exit 2; }
[[ "$hb_timeout" =~ ^[1-9][0-9]?$ ]] ||
  { echo "recovery.sh: bad --heartbeat-timeout '$hb_timeout': want 1..99 seconds" >&2; exit 2; }
case "$torch" in 1.13 | 2.6) ;; *) echo "recovery.sh: --torch '$torch': want 1.13 or 2.6" >&2; exit 2 ;; esac
for w in $workers; do
  case "$w" in c | torch) ;; *) echo "recovery.sh: --workers '$w': want c or torch" >&2; exit 2 ;; esac
done
for v in $victims; do
  case "$v" in 0 | 1) ;; *) echo "recovery.sh: --victims '$v': want 0 or 1" >&2; exit 2 ;; esac
done
for n in $spare_counts; do
  case "$n" in 0 | 1 | 2) ;; *) echo "recovery.sh: --spares '$n': want 0, 1 or 2" >&2; exit 2 ;; esac
done
[ "$(id -u)" = 0 ] || { echo "recovery.sh: needs root (network namespaces for the pods)" >&2; exit 1; }
py=/usr/bin/python3
[ "$torch" = 2.6 ] && py="$PWD/tests/testlib/torch26/python3"
if [[ " $workers " == *" torch "* ]] && ! "$py" -c 'import torch.distributed' 2>/dev/null; then
  echo "recovery.sh: PyTorch $torch is not installed (bash .ci/setup)" >&2; exit 1
fi

bazel build -c opt --color=no --curses=no //operator-agent:tdist-agent //examples/train:train </dev/null
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
tmp="$(mktemp -d /tmp/recovery_bench.XXXXXX)"
cp "$bin/operator-agent/tdist-agent" "$bin/examples/train/train" examples/torch/ddp_train.py "$tmp/"
AGENT="$tmp/tdist-agent"

# shellcheck source=../../tests/agent/pods/pods.sh
source tests/agent/pods/pods.sh
pods_init job svc ns cluster.local
declare -A APID

# start_pod INDEX SPARES WORKER DIR: (re)creates pod job-INDEX and runs the agent in it.
start_pod() {
  local i=$1 spares=$2 w=$3 d=$4 job
  if [ "$w" = torch ]; then
    job=("$py" "$tmp/ddp_train.py" --steps 100000 --step-sleep 0.02 --events "$d/events")
  else
    job=("$tmp/train" --steps 100000 --step-ms 20 --print-every 0 --events "$d/events")
  fi
  pods_start "job-$i" >/dev/null || return 1
  pods_exec "job-$i" JOB_COMPLETION_INDEX="$i" POD_NAMESPACE=ns -- \
    "$AGENT" --nnodes 3 --spares "$spares" --nproc-per-node 1 --max-restarts 5 --service svc \
      --master-port 29500 --heartbeat-interval 0.5 --heartbeat-timeout "$hb_timeout" \
      --rdzv-timeout 300 --stop-grace-period 2 --monitor-interval 0.1 --http-port -1 \
      -- /bin/sh -c 'echo "launch $TORCHELASTIC_RESTART_COUNT $RANK $(date +%s.%N)" >>"$0"; exec "$@"' \
      "$d/events" "${job[@]}" >>"$d/job-$i.log" 2>&1
  APID[$i]=$PODS_PID
}

kill_all() {
  local n
  for n in $(pods_list); do pods_kill "$n" KILL >/dev/null 2>&1 || true; done
  for n in "${!APID[@]}"; do wait "${APID[$n]}" 2>/dev/null || true; done
  APID=()
}

# count EVENTS_FILE WHAT AFTER: the number of WHAT lines stamped after AFTER (seconds)
count() { awk -v w="$2" -v t="$3" '$1 == w && $4 > t { n++ } END { print n + 0 }' "$1" 2>/dev/null || echo 0; }

# one WORKER SPARES VICTIM DIR: one run; writes DIR/result "ok RECOVERY LAUNCH" or "fail WHY".
one() {
  local w=$1 spares=$2 victim=$3 d=$4 i t_loss replaced=0
  mkdir -p "$d"
  : >"$d/events"
  for ((i = 0; i < 3 + spares; i++)); do
    start_pod "$i" "$spares" "$w" "$d" || { echo "fail pod-start" >"$d/result"; kill_all; return; }
  done
  for ((i = 0; i < 1800; i++)); do
    [ "$(count "$d/events" first_step 0)" -ge 3 ] && break
    sleep 0.1
  done
  if [ "$(count "$d/events" first_step 0)" -lt 3 ]; then
    echo "fail no-start" >"$d/result"; kill_all; return
  fi
  sleep 1 # steady training
  t_loss=$EPOCHREALTIME
  ip -n "$(pods_netns "job-$victim")" link set eth0 down
  pods_kill "job-$victim" KILL >/dev/null
  wait "${APID[$victim]}" 2>/dev/null || true
  for ((i = 0; i < 1200; i++)); do
    if ((!replaced)) && awk -v now="$EPOCHREALTIME" -v t="$t_loss" -v d="$delay" 'BEGIN { exit !(now - t >= d) }'; then
      start_pod "$victim" "$spares" "$w" "$d" || { echo "fail replacement-start" >"$d/result"; kill_all; return; }
      replaced=1
    fi
    [ "$(count "$d/events" first_step "$t_loss")" -ge 3 ] && break
    sleep 0.1
  done
  if [ "$(count "$d/events" first_step "$t_loss")" -lt 3 ]; then
    echo "fail no-recovery-in-120s" >"$d/result"; kill_all; return
  fi
  awk -v t="$t_loss" '
    $4 > t && $1 == "first_step" { if (++f <= 3) s = $4 }
    $4 > t && $1 == "launch" { if (++l <= 3) x = $4 }
    END { printf "ok %.2f %.2f\n", s - t, x - t }' "$d/events" >"$d/result"
  kill_all
}

rows=()
for w in $workers; do
  for victim in $victims; do
    for spares in $spare_counts; do rows+=("$w $victim $spares"); done
  done
done
echo "recovery.sh: $runs run(s) of ${#rows[@]} rows; heartbeat timeout $hb_timeout s, replacement" \
  "after $delay s, PyTorch $torch; logs in $tmp"
for ((r = 1; r <= runs; r++)); do
  for row in "${rows[@]}"; do
    read -r w victim spares <<<"$row"
    d="$tmp/$w-$victim-$spares/$r"
    one "$w" "$spares" "$victim" "$d"
    echo "  run $r: $w workers, job-$victim lost, $spares spare(s): $(cat "$d/result")"
  done
done

echo
echo "Recovery after losing a pod (3-node job, heartbeat timeout $hb_timeout s, replacement pod after" \
  "$delay s; seconds, median [min..max] over the runs that recovered)"
printf '%-18s %-16s %-7s %5s %22s %22s\n' workers lost spares ok "recovery" "launch"
for row in "${rows[@]}"; do
  read -r w victim spares <<<"$row"
  wn="C example"
  [ "$w" = torch ] && wn="PyTorch $torch DDP"
  vn="member (job-1)"
  [ "$victim" = 0 ] && vn="pod 0 (store)"
  cat "$tmp/$w-$victim-$spares"/*/result | awk -v wn="$wn" -v vn="$vn" -v s="$spares" -v n="$runs" '
    function med(a, k,   i, j, x) {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
      return sprintf("%.2f [%.2f..%.2f]", k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2, a[1], a[k])
    }
    $1 == "ok" { ok++; rec[ok] = $2; la[ok] = $3 }
    END {
      printf "%-18s %-16s %-7s %2d/%-2d %22s %22s\n", wn, vn, s, ok, n,
        ok ? med(rec, ok) : "-", ok ? med(la, ok) : "-"
    }'
done
