# Sourced by shell tests: `bounded SECS CMD...` runs CMD with a time limit like `timeout`, but a
# hang leaves evidence. Past the limit it writes to the test's own stderr (fd 9 when the caller
# opened it, e.g. `exec 9>&2` before redirecting the command) the process tree under CMD, each
# process's wait channel and native stacks (gdb, when installed), then sends SIGABRT to the
# Python processes among them (faulthandler, which PyTorch's @record enables, prints every
# thread's Python stack), SIGTERM to CMD, SIGKILL to all of them after 5 s, and returns 124.

_bounded_tree() { # PID: PID and its descendants, parents first
  local p=$1 c
  echo "$p"
  for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do _bounded_tree "$c"; done
}

_bounded_report() { # PID SECS
  local pid=$1 secs=$2 p
  local pids
  pids=$(_bounded_tree "$pid")
  echo "=== HANG: '$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)' still running after ${secs} s"
  # shellcheck disable=SC2086
  ps -o pid,ppid,pgid,stat,etime,wchan:24,args -p "$(echo $pids | tr ' ' ',')" 2>/dev/null
  local err
  err=$(readlink "/proc/$pid/fd/2" 2>/dev/null)
  if [ -f "$err" ]; then echo "--- last 40 lines of its stderr ($err):"; tail -n 40 "$err"; fi
  if command -v gdb >/dev/null; then
    for p in $pids; do
      echo "--- native stacks of $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-160)"
      timeout 60 gdb -p "$p" -batch -nx -ex "set pagination off" -ex "thread apply all bt 25" \
        2>/dev/null | grep -E '^(Thread|#)' | head -n 200
    done
  fi
  local py=""
  for p in $pids; do
    case "$(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null)" in *python*) py="$py $p" ;; esac
  done
  if [ -n "$py" ]; then
    echo "--- SIGABRT to the Python processes ($py ) for their faulthandler stacks (in CMD's stderr):"
    # shellcheck disable=SC2086
    kill -ABRT $py 2>/dev/null
    sleep 2
    [ -f "$err" ] && tail -n 80 "$err"
  fi
  echo "=== end of hang report"
}

bounded() { # SECS CMD...
  local secs=$1 pid n=0
  shift
  "$@" <&0 &  # explicit: a background job would otherwise get /dev/null as stdin
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ $n -ge $((secs * 10)) ]; then
      local all
      all=$(_bounded_tree "$pid")
      if { true >&9; } 2>/dev/null; then _bounded_report "$pid" "$secs" >&9 2>&1
      else _bounded_report "$pid" "$secs" >&2; fi
      kill -TERM "$pid" 2>/dev/null
      sleep 5
      # shellcheck disable=SC2086
      kill -KILL $all 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 0.1
    n=$((n + 1))
  done
  wait "$pid"
}
