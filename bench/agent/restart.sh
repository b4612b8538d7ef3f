#!/usr/bin/env bash
# Restart benchmark: tdist-agent against torchrun on the same job and the same crash, in one run,
# repetitions interleaved (the order alternates each repetition), one table at the end.
#
#   bash bench/agent/restart.sh              10 runs per launcher and PyTorch (~10 min on 2 cores)
#   bash bench/agent/restart.sh --runs 4     fewer
#   bash bench/agent/restart.sh --torch 2.6  only PyTorch 2.6 (default: 2.6 and 1.13)
#
# The job: examples/torch/ddp_train.py, 2 workers (--standalone --nproc-per-node 2, each
# launcher's defaults otherwise, --max-restarts 1), 60 steps with 0.05 s sleeps; on attempt 0 one
# rank crashes after init_process_group at a random step (a new seed every run: the same seed for
# both launchers within a repetition). A run succeeds when the launcher exits 0 within 180 s and
# attempt 1 trained to the end with identical parameters; otherwise it is a failure (exit code)
# or a hang (killed at 180 s, with everything it started).
# Recovery: seconds from the crash (the victim's time stamp right before it dies) to the first
# training step of attempt 1 (the earliest rank's), from the script's --events file; median and
# range over the successful runs.
# torchrun is the PyTorch's own `python3 -m torch.distributed.run` (1.13 with --redirects 1
# --tee 1, which Debian's Python 3.11 needs); PyTorch 2.6 is the root of
# tests/testlib/torch26/setup.sh (bash .ci/setup builds it). Prints numbers; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

runs=10 versions="2.6 1.13"
while (($#)); do
  case "$1" in
    --runs) runs="${2:?--runs needs a number}"; shift ;;
    --torch) versions="${2:?--torch needs 2.6 or 1.13}"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "restart.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$runs" =~ ^[1-9][0-9]{0,2}$ ]] || { echo "restart.sh: bad --runs '$runs': want 1..999" >&2; exit 2; }
for v in $versions; do
  case "$v" in 2.6 | 1.13) ;; *) echo "restart.sh: --torch '$v': want 2.6 or 1.13" >&2; exit 2 ;; esac
done

bazel build -c opt --color=no --curses=no //operator-agent:tdist-agent </dev/null
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
tmp="$(mktemp -d /tmp/restart_bench.XXXXXX)"
trap 'pkill -KILL -P $$ 2>/dev/null || true' EXIT
cp "$bin/operator-agent/tdist-agent" examples/torch/ddp_train.py "$tmp/"
AGENT="$tmp/tdist-agent" DDP="$tmp/ddp_train.py"

py_of() { [ "$1" = 2.6 ] && echo "$PWD/tests/testlib/torch26/python3" || echo /usr/bin/python3; }
for v in $versions; do
  "$(py_of "$v")" -c 'import torch.distributed.run' 2>/dev/null ||
    { echo "restart.sh: PyTorch $v is not installed (bash .ci/setup)" >&2; exit 1; }
done

# one LAUNCHER VERSION SEED DIR: runs the job once; writes DIR/result: "ok SECONDS" / "fail RC" /
# "hang".
one() {
  local launcher=$1 v=$2 seed=$3 d=$4 py rc=0
  py="$(py_of "$v")"
  mkdir -p "$d"
  local job=("$DDP" --steps 60 --step-sleep 0.05 --crash-until-attempt 1 --seed "$seed"
             --events "$d/events")
  if [ "$launcher" = tdist-agent ]; then
    (cd "$d" && TDIST_PYTHON="$py" timeout -k 5 180 "$AGENT" --http-port -1 --standalone \
       --nproc-per-node 2 --max-restarts 1 -- "${job[@]}") >"$d/out" 2>&1 || rc=$?
  else
    local extra=()
    [ "$v" = 1.13 ] && extra=(--redirects 1 --tee 1)
    # 1.13's torchrun knows only the underscore spellings.
    (cd "$d" && timeout -k 5 180 "$py" -m torch.distributed.run --standalone --nproc_per_node 2 \
       --max_restarts 1 "${extra[@]}" "${job[@]}") >"$d/out" 2>&1 || rc=$?
  fi
  pkill -KILL -f "$d/events" 2>/dev/null || true # anything a hung launcher left behind
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo hang >"$d/result"; return; fi
  if [ "$rc" -ne 0 ] || ! grep -q "done: world 2 attempt 1 .*params identical: True" "$d/out"; then
    echo "fail $rc" >"$d/result"; return
  fi
  awk '$1 == "crash" && $2 == 0 { c = $4 }
       $1 == "step0" && $2 == 1 && (s == "" || $4 < s) { s = $4 }
       END { if (c != "" && s != "") printf "ok %.3f\n", s - c; else print "fail nostamps" }' \
    "$d/events" >"$d/result"
}

echo "restart.sh: $runs run(s) per launcher and PyTorch version ($versions); logs in $tmp"
for ((i = 1; i <= runs; i++)); do
  seed=$((RANDOM + 1))
  for v in $versions; do
    order=(tdist-agent torchrun)
    ((i % 2)) || order=(torchrun tdist-agent)
    for l in "${order[@]}"; do
      one "$l" "$v" "$seed" "$tmp/$l-$v/$i"
      echo "  run $i, PyTorch $v, $l (seed $seed): $(cat "$tmp/$l-$v/$i/result")"
    done
  done
done

# summary: per (launcher, version) success fraction, hangs, recovery median [min..max].
echo
printf '%-12s %-8s %9s %6s %6s %22s\n' launcher pytorch succeeded failed hangs "recovery s (median, range)"
for v in $versions; do
  for l in tdist-agent torchrun; do
    cat "$tmp/$l-$v"/*/result | awk -v l="$l" -v v="$v" -v n="$runs" '
      $1 == "ok" { ok++; t[ok] = $2 } $1 == "fail" { f++ } $1 == "hang" { h++ }
      END {
        r = "-"
        if (ok) {
          for (i = 1; i <= ok; i++) for (j = i + 1; j <= ok; j++) if (t[j] < t[i]) { x = t[i]; t[i] = t[j]; t[j] = x }
          m = ok % 2 ? t[(ok + 1) / 2] : (t[ok / 2] + t[ok / 2 + 1]) / 2
          r = sprintf("%.2f [%.2f..%.2f]", m, t[1], t[ok])
        }
        printf "%-12s %-8s %5d/%-3d %6d %6d %22s\n", l, v, ok, n, f, h, r
      }'
  done
done
