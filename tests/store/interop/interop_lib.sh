# Shell helpers shared by the PyTorch interop sh_tests: start a TCPStore server (a real PyTorch
# master in its own process, or our `tdist-store serve`), wait (bounded) for the port it wrote,
# and kill every server this script started when the script exits, however it exits.
#
# The PyTorch is the one of $TDIST_TORCH (1.13 or 2.6; torch_sh_test in tests/testlib/torch.bzl
# sets it per test variant, default 1.13): tests/testlib/torch.sh picks and checks the
# interpreter, $PYTHON below, and sets TORCH_TAG / TORCH_MAJOR_MINOR / TORCH_VERSION.
#
# Sourced, not executed. Must never leave a server running and never wait without a bound.
# Everything goes under $INTEROP_TMP ($TEST_TMPDIR under bazel).

set -u

INTEROP_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../testlib/torch.sh
source "$INTEROP_DIR/../../testlib/torch.sh"
PYTHON="$PY"
INTEROP_TMP="${TEST_TMPDIR:-$(mktemp -d /tmp/tdist-interop.XXXXXX)}"
INTEROP_PIDS=()

interop_log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

interop_fail() {
  echo "FAIL: $*" >&2
  if [ -n "${INTEROP_SEED:-}" ]; then
    echo "FAIL: random seed was ${INTEROP_SEED}; rerun with INTEROP_SEED=${INTEROP_SEED}" >&2
  fi
  exit 1
}

interop_cleanup() {
  local pid
  for pid in "${INTEROP_PIDS[@]+"${INTEROP_PIDS[@]}"}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  # Give them a moment to exit cleanly, then make sure.
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    local alive=0
    for pid in "${INTEROP_PIDS[@]+"${INTEROP_PIDS[@]}"}"; do
      kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${INTEROP_PIDS[@]+"${INTEROP_PIDS[@]}"}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  INTEROP_PIDS=()
}
trap interop_cleanup EXIT
trap 'interop_cleanup; exit 130' INT
trap 'interop_cleanup; exit 143' TERM

# The seed every random choice of this run derives from (printed, so a failure can be replayed).
interop_pick_seed() {
  if [ -z "${INTEROP_SEED:-}" ]; then
    INTEROP_SEED="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
  fi
  export INTEROP_SEED
  interop_log "seed=${INTEROP_SEED} (set INTEROP_SEED to replay), PyTorch $TORCH_VERSION"
}

# interop_wait_port FILE PID TIMEOUT_S -> prints the port; fails if PID dies or time runs out.
interop_wait_port() {
  local file="$1" pid="$2" timeout_s="$3"
  local deadline=$(( $(date +%s) + timeout_s ))
  while [ "$(date +%s)" -le "$deadline" ]; do
    if [ -s "$file" ]; then
      local port
      port="$(head -n1 "$file" | tr -d '[:space:]')"
      if [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -gt 0 ] && [ "$port" -lt 65536 ]; then
        echo "$port"
        return 0
      fi
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      interop_fail "server (pid $pid) exited before writing its port to $file"
    fi
    sleep 0.05
  done
  interop_fail "no port in $file after ${timeout_s}s (server pid $pid)"
}

# interop_start_server KIND NAME TDIST_STORE_BIN [UPSTREAM_PORT] -> sets SERVER_PID and
# SERVER_PORT. KIND is "torch" (a PyTorch master of $TORCH_VERSION), "tdist" (our tdist-store
# serve) or "proxy" (our tdist-store proxy to the tdist server on UPSTREAM_PORT).
interop_start_server() {
  local kind="$1" name="$2" bin="${3:-}"
  local port_file="$INTEROP_TMP/$name.port" log="$INTEROP_TMP/$name.log"
  rm -f "$port_file"
  case "$kind" in
    torch)
      "$PYTHON" "$INTEROP_DIR/torch_server.py" --port-file "$port_file" --max-life-s 280 \
        >"$log" 2>&1 &
      ;;
    tdist)
      [ -x "$bin" ] || interop_fail "tdist-store binary not found or not executable: '$bin'"
      # TDIST_SERVE_HOST="" binds the default ("::", dual stack), like PyTorch's server does.
      local host_args=(--host "${TDIST_SERVE_HOST-127.0.0.1}")
      [ -n "${TDIST_SERVE_HOST-127.0.0.1}" ] || host_args=()
      "$bin" serve "${host_args[@]+"${host_args[@]}"}" --port 0 --port-file "$port_file" \
        >"$log" 2>&1 &
      ;;
    proxy)
      # A tdist-store proxy in front of our server (port $4), as an agent's on a worker's node.
      [ -x "$bin" ] || interop_fail "tdist-store binary not found or not executable: '$bin'"
      "$bin" proxy --upstream "127.0.0.1:${4:?proxy needs the server port}" --port 0 \
        --port-file "$port_file" >"$log" 2>&1 &
      ;;
    *) interop_fail "unknown server kind $kind" ;;
  esac
  SERVER_PID=$!
  INTEROP_PIDS+=("$SERVER_PID")
  # Importing torch takes seconds on a loaded 2-core machine.
  SERVER_PORT="$(interop_wait_port "$port_file" "$SERVER_PID" 60)" || {
    echo "--- $log ---" >&2
    tail -n 40 "$log" >&2
    exit 1
  }
  interop_log "$kind server '$name' pid=$SERVER_PID port=$SERVER_PORT (log: $log)"
}

# interop_stop_server PID NAME: stops one server; fails if it already died (a crash is a bug).
interop_stop_server() {
  local pid="$1" name="$2"
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "--- log of $name ---" >&2
    cat "$INTEROP_TMP/$name.log" >&2 || true
    interop_fail "server '$name' (pid $pid) died during the test"
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    interop_fail "server '$name' (pid $pid) did not exit within 5s of SIGTERM"
  fi
  wait "$pid" 2>/dev/null
  local rc=$?
  local keep=() p
  for p in "${INTEROP_PIDS[@]+"${INTEROP_PIDS[@]}"}"; do
    [ "$p" = "$pid" ] || keep+=("$p")
  done
  INTEROP_PIDS=("${keep[@]+"${keep[@]}"}")
  return "$rc"
}

# interop_dump_logs: prints every server log (on failure).
interop_dump_logs() {
  local f
  for f in "$INTEROP_TMP"/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f (last 40 lines) ---" >&2
    tail -n 40 "$f" >&2
  done
}

# interop_compare A B WHAT: fails with a unified diff when the transcripts differ.
interop_compare() {
  local a="$1" b="$2" what="$3"
  if ! diff -u "$a" "$b" >"$INTEROP_TMP/diff.txt"; then
    echo "--- transcripts differ ($what): - torch $TORCH_VERSION server, + tdist server ---" >&2
    head -n 200 "$INTEROP_TMP/diff.txt" >&2
    interop_fail "$what: transcripts differ"
  fi
  interop_log "$what: transcripts identical ($(wc -l <"$a") lines)"
}
