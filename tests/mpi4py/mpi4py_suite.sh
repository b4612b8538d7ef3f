#!/usr/bin/env bash
# mpi4py's own test suite (its repository's test/, at the tag of the installed python3-mpi4py),
# 4 ranks, each test file a job of its own with a per-file timeout, run three ways:
#   mpirun    mpirun --oversubscribe -n 4 (the reference)
#   agent1x4  one tdist-agent --backend mpi --standalone --nproc-per-node 4 as the PMIx server
#   agent2x2  two tdist-agents on this host (--nnodes 2, node ranks 0 and 1), 2 ranks each
# then mpi4py_compare.py: every test that passes under mpirun passes under each agent mode,
# except what mpi4py_expected.txt lists for that mode, with its reason. The suite's code is not
# in this tree (Debian ships no tests, CI cannot get them); tell the script where it is:
#   git clone -b 3.1.4 https://github.com/mpi4py/mpi4py /tmp/mpi4py   # the installed version's tag
#   bazel test //tests/mpi4py:mpi4py_test --test_env=TDIST_MPI4PY_TESTS=/tmp/mpi4py/test
# Environment (all optional but TDIST_MPI4PY_TESTS):
#   TDIST_MPI4PY_MODES         modes to run, default "mpirun agent1x4 agent2x2" (mpirun always runs)
#   TDIST_MPI4PY_FILES         test files (names without .py), default every test_*.py but
#                              test_spawn (MPI_Comm_spawn: refused by the agent by design)
#   TDIST_MPI4PY_FILE_TIMEOUT  seconds per file and mode, default 300: a hang fails its tests
#   TDIST_MPI4PY_RDZV_TIMEOUT  the agents' --rdzv-timeout (PMIx fences, lookups), default 60
#   TDIST_MPI4PY_OUT           where the logs go (default: the test's undeclared outputs)
#   args: AGENT RANK_PY COMPARE_PY EXPECTED MPI_ENV_SH PORTS_SH
set -uo pipefail
AGENT="$(realpath "$1")"; RANK_PY="$(realpath "$2")"; COMPARE="$(realpath "$3")"
EXPECTED="$(realpath "$4")"
# shellcheck source=../mpi/mpi_env.sh
. "$5"
# shellcheck source=../testlib/ports.sh
. "$6"
PY=/usr/bin/python3
NP=4
TESTS="${TDIST_MPI4PY_TESTS:-}"
if [ -z "$TESTS" ] || [ ! -f "$TESTS/mpiunittest.py" ]; then
  echo "FAIL: TDIST_MPI4PY_TESTS='$TESTS' is not mpi4py's test/ directory (no mpiunittest.py)."
  echo "  Get it at the tag of the installed mpi4py ($($PY -c 'import mpi4py; print(mpi4py.__version__)' 2>&1)):"
  echo "  git clone -b <that tag> https://github.com/mpi4py/mpi4py DIR, then"
  echo "  bazel test //tests/mpi4py:mpi4py_test --test_env=TDIST_MPI4PY_TESTS=DIR/test"
  exit 1
fi
TESTS="$(realpath "$TESTS")"
have=$($PY -c 'import mpi4py; print(mpi4py.__version__)') || { echo "FAIL: python3-mpi4py is not installed"; exit 1; }
src_ver=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$TESTS/../src/mpi4py/__init__.py" 2>/dev/null)
[ -z "$src_ver" ] || [ "$src_ver" = "$have" ] ||
  echo "WARNING: the tests are mpi4py $src_ver's, the installed mpi4py is $have: differences may be the version's"
FT="${TDIST_MPI4PY_FILE_TIMEOUT:-300}"
RT="${TDIST_MPI4PY_RDZV_TIMEOUT:-60}"
MODES=mpirun
for m in ${TDIST_MPI4PY_MODES:-agent1x4 agent2x2}; do
  case $m in
    mpirun) ;;
    agent1x4 | agent2x2) MODES+=" $m" ;;
    *) echo "FAIL: TDIST_MPI4PY_MODES: '$m' is not mpirun, agent1x4 or agent2x2"; exit 1 ;;
  esac
done
OUT="${TDIST_MPI4PY_OUT:-${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-$(mktemp -d)}}}/mpi4py"
mkdir -p "$OUT"
if [ -n "${TDIST_MPI4PY_FILES:-}" ]; then
  FILES="$TDIST_MPI4PY_FILES"
else
  FILES=$(cd "$TESTS" && ls test_*.py | sed 's/\.py$//' | grep -vx test_spawn | tr '\n' ' ')
fi
# mpirun's shared-memory segments go to mpi_env.sh's directory (MPIRUN), removed at the end,
# so that a rank killed by the timeout leaves nothing in /dev/shm. Only mpirun's: each agent
# gives its job's ranks a directory of its own and removes it.
# Not set here: mpirun --oversubscribe and the agent (when ranks outnumber CPUs) both give ranks
# OMPI_MCA_mpi_oversubscribe=1 themselves.
# The agent runs workers with its own environment: Open MPI's settings above reach them.
export TDIST_LOG_LEVEL="${TDIST_LOG_LEVEL:-info}"

# run_file MODE NAME: one test file as one job; its launcher's status in MODE/NAME.rc.
run_file() {
  local mode=$1 name=$2 d="$OUT/$1" rc=0
  local cmd=("$PY" "$RANK_PY" "$TESTS" "$name" "$d/$name")
  rm -f "$d/$name".*
  case $mode in
    mpirun)
      timeout -k 10 "$FT" "${MPIRUN[@]}" -n $NP "${cmd[@]}" >"$d/$name.log" 2>&1 || rc=$? ;;
    agent1x4)
      timeout -k 10 "$FT" "$AGENT" --standalone --backend mpi --nproc-per-node $NP \
        --rdzv-timeout "$RT" --stop-grace-period 2 --http-port 0 -- "${cmd[@]}" >"$d/$name.log" 2>&1 || rc=$? ;;
    agent2x2)
      local mp n pids=() r
      mp=$(free_port)
      for n in 0 1; do
        timeout -k 10 "$FT" "$AGENT" --backend mpi --nnodes 2 --node-rank $n \
          --master-addr 127.0.0.1 --master-port "$mp" --run-id "m4p-$$-$name" \
          --nproc-per-node $((NP / 2)) --rdzv-timeout "$RT" --stop-grace-period 2 --http-port 0 \
          -- "${cmd[@]}" >"$d/$name.log.$n" 2>&1 &
        pids+=($!)
      done
      for n in 0 1; do wait "${pids[$n]}"; r=$?; [ $r = 0 ] || [ $rc = 124 ] || rc=$r; done
      cat "$d/$name.log.0" "$d/$name.log.1" >"$d/$name.log"
      rm -f "$d/$name.log.0" "$d/$name.log.1" ;;
  esac
  echo $rc >"$d/$name.rc"
  echo "  $mode $name: exit $rc ($(cat "$d/$name".[0-9] 2>/dev/null | grep -c '^ok ') ok, $(cat "$d/$name".[0-9] 2>/dev/null | grep -cE '^(fail|error) ') fail/error over $NP ranks)"
}

t0=$SECONDS
echo "== $(wc -w <<<"$FILES") files x modes $MODES, $FT s each at most"
for mode in $MODES; do mkdir -p "$OUT/$mode"; done
# File by file, every mode in turn: a run cut short still compares what it ran.
for f in $FILES; do
  for mode in $MODES; do run_file "$mode" "$f"; done
done
echo "== compare (logs: $OUT; $((SECONDS - t0)) s)"
args=()
for mode in $MODES; do [ "$mode" = mpirun ] || args+=("$mode=$OUT/$mode"); done
$PY "$COMPARE" "$EXPECTED" $NP "$OUT/mpirun" "${args[@]}"
