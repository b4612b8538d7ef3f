#!/usr/bin/env bash
# Overhead of the per-rank statistics (TDIST_STATS_FILE, include/tdist/stats.h) on the smallest
# collective, where it weighs most: an 8-byte (2 x float32) all_reduce, 2 and 4 ranks, over
# loopback TCP (TDIST_SHM=0) and the shared-memory rings (TDIST_SHM=1), and 1 rank, where the
# collective itself does nothing and the difference is the statistics' own cost per call.
#
#   bash bench/stats/run.sh [--passes P] [--iters I] [--ranks 1,2,4] [--transports tcp,shm]
#
# Same binary, same run: the collectives benchmark's worker (bench/collectives/coll_bench --worker,
# env:// rendezvous, its timing loop in bench_common.c), started once per pass without and once
# with TDIST_STATS_FILE, the two orders alternating from pass to pass so drift on a busy machine
# falls on both sides. Each pass gives the slowest rank's median per-call time over I timed calls
# (after coll_bench's 0.3 s warm-up and 10% more untimed calls); the table shows the median over
# the passes and its spread (min..max), and the ratio with/without. Prints; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
passes=9 iters=4000 ranks=1,2,4 transports=tcp,shm
while [ $# -gt 0 ]; do
  case "$1" in
    --passes) passes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --transports) transports=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

bazel build -c opt --color=no --curses=no //bench/collectives:coll_bench </dev/null >&2
# The bazel-bin symlink follows whichever configuration built last in this shared workspace.
bin="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/collectives/coll_bench"
tmp="$(mktemp -d /tmp/stats_bench.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# launch WORLD TRANSPORT MODE OUT: one run of WORLD ranks writing OUT/bench.<rank>.tsv; its status.
launch() {
  local world=$1 tr=$2 mode=$3 out=$4 port pids=() rc=0
  rm -rf "$out"
  mkdir -p "$out"
  port=$(free_port)
  for ((r = 0; r < world; r++)); do
    (
      export RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
      export TDIST_SHM=$([ "$tr" = shm ] && echo 1 || echo 0)
      if [ "$mode" = on ]; then export TDIST_STATS_FILE="$out/stats.$r"; else unset TDIST_STATS_FILE; fi
      exec "$bin" --worker --impl bench --out "$out" --colls all_reduce --sizes 8 \
        --iters "$iters" --warmup $((iters / 10)) --timeout-s 120
    ) >"$out/log.$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

# run_once WORLD TRANSPORT MODE PASS: appends "world transport mode pass median_ns" (slowest
# rank) to $tmp/results. A failed run gets a second try (the free port may have been taken
# before rank 0 bound it).
run_once() {
  local world=$1 tr=$2 mode=$3 pass=$4 out="$tmp/$1.$2.$3.$4"
  if ! launch "$world" "$tr" "$mode" "$out"; then
    echo "run.sh: $world ranks $tr stats $mode pass $pass failed; once more. Logs:" >&2
    tail -n 3 "$out"/log.* >&2
    launch "$world" "$tr" "$mode" "$out" || { tail -n 3 "$out"/log.* >&2; exit 1; }
  fi
  if [ "$mode" = on ]; then  # the statistics were really on: every rank's file counted the calls
    for ((r = 0; r < world; r++)); do
      python3 - "$out/stats.$r" "$iters" <<'PYEOF'
import struct, sys
b = open(sys.argv[1], "rb").read()
magic, version, size = struct.unpack_from("<III", b, 0)
assert magic == 0x54445354 and version == 2 and size == len(b), (hex(magic), version, size, len(b))
# ops[0] (all_reduce; the owner thread's set) + shared_ops[0], the file's last 2016 bytes being
# the shared set (4 x 12 counters + 12 x 17 histogram buckets, 8 bytes each)
ops_all_reduce = struct.unpack_from("<Q", b, 32)[0] + struct.unpack_from("<Q", b, size - 2016)[0]
assert ops_all_reduce > int(sys.argv[2]), ops_all_reduce
PYEOF
    done
  fi
  awk -v w="$world" -v t="$tr" -v m="$mode" -v p="$pass" \
    'BEGIN { mx = 0 } $4 == "all_reduce" { if ($7 > mx) mx = $7 } END { print w, t, m, p, mx }' \
    "$out"/bench.*.tsv >>"$tmp/results"
}

IFS=, read -r -a worlds <<<"$ranks"
IFS=, read -r -a trs <<<"$transports"
for ((pass = 0; pass < passes; pass++)); do
  for world in "${worlds[@]}"; do
    for tr in "${trs[@]}"; do
      [ "$world" = 1 ] && [ "$tr" != "${trs[0]}" ] && continue  # one rank: no transport
      if ((pass % 2)); then order="on off"; else order="off on"; fi
      for mode in $order; do run_once "$world" "$tr" "$mode" "$pass"; done
    done
  done
  echo "run.sh: pass $((pass + 1))/$passes done" >&2
done

python3 - "$tmp/results" "$iters" "$passes" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
iters, passes = sys.argv[2], sys.argv[3]
cell = {}
for w, t, m, p, ns in rows:
    cell.setdefault((int(w), t, m), []).append(int(ns) / 1000.0)
print("# all_reduce of 8 B (2 x float32, sum): median per-call latency, slowest rank; median over %s"
      " interleaved passes of %s timed calls (min..max over the passes)" % (passes, iters))
print("# ratio = with TDIST_STATS_FILE / without")
print("#%6s %9s | %10s %15s | %10s %15s | %7s" % ("ranks", "transport", "off us", "(min..max)",
                                                  "on us", "(min..max)", "ratio"))
for (w, t) in sorted({(w, t) for (w, t, m) in cell}, key=lambda k: (k[0], k[1] != "tcp")):
    off, on = cell[(w, t, "off")], cell[(w, t, "on")]
    mo, mn = statistics.median(off), statistics.median(on)
    print(" %6d %9s | %10.3f %15s | %10.3f %15s | %7.3f" % (
        w, "-" if w == 1 else t, mo, "(%.2f..%.2f)" % (min(off), max(off)), mn,
        "(%.2f..%.2f)" % (min(on), max(on)), mn / mo))
PYEOF
