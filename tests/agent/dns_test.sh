#!/usr/bin/env bash
# Discovery against real DNS: dnsmasq plays the cluster DNS of a headless Service inside a private
# mount + network namespace (`unshare -m -n`, needs root), with a resolv.conf like kubelet's
# bind-mounted over /etc/resolv.conf. resolve_driver runs the real agent_resolve/agent_master_name.
# Checks: short and partial names resolve through the search list; a record that appears only
# after 1.5 s (added to the hosts file, then SIGHUP) is found after retries; a name that never
# appears fails at the deadline naming the name and the resolver error; a resolved address that
# refuses connections is retried until it listens; a dead DNS server is retried, then reported.
#   args: RESOLVE_DRIVER
set -uo pipefail
DRIVER="$(realpath "$1")"

if [ -z "${DNS_TEST_IN_NS:-}" ]; then
  if [ "$(id -u)" != 0 ] || ! unshare -m -n true 2>/dev/null; then
    LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
    [ -f "$LIB/skip.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
    . "$LIB/skip.sh"
    test_skip "dns_test: every check: needs root and unshare -m -n (private network and mount" \
      "namespaces); uid $(id -u)"
    exit
  fi
  exec unshare -m -n env DNS_TEST_IN_NS=1 "$(realpath "$0")" "$@"
fi

DNSMASQ="$(command -v dnsmasq || echo /usr/sbin/dnsmasq)"
[ -x "$DNSMASQ" ] || { echo "dns_test: FAIL: dnsmasq not found (apt-get install dnsmasq-base)"; exit 1; }
T="${TEST_TMPDIR:-$(mktemp -d)}/dns.$$"
mkdir -p "$T"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # pass, fail, $fails, agent_test_end, agent_started, agent_in_pod
dns_pid=
cleanup() { [ -n "$dns_pid" ] && kill "$dns_pid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

# field KEY LINE: the value of KEY=... in a driver output line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

ip link set lo up
cat >"$T/hosts" <<HOSTS
10.0.0.7 other.ns1.svc.k8s.test
127.0.0.1 store.ns1.svc.k8s.test
HOSTS
cat >"$T/resolv.conf" <<RESOLV
search ns1.svc.k8s.test svc.k8s.test k8s.test
nameserver 127.0.0.1
options ndots:5 timeout:1 attempts:2
RESOLV
mount --bind "$T/resolv.conf" /etc/resolv.conf || { echo "FAIL: bind-mount resolv.conf"; exit 1; }

# --local: the server is authoritative for k8s.test, so unknown names are NXDOMAIN (as CoreDNS
# answers for a pod record that does not exist yet); --no-negcache: a SIGHUP'd record is seen.
"$DNSMASQ" --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$T/hosts" \
  --listen-address=127.0.0.1 --bind-interfaces --port=53 --local=/k8s.test/ --no-negcache \
  --user=root --pid-file="$T/dnsmasq.pid" --log-queries --log-facility="$T/dnsmasq.log" &
dns_pid=$!

# 0. The server answers (the driver's own retry loop waits for it to start).
out="$("$DRIVER" --timeout-ms 10000 other.ns1.svc.k8s.test.)"
[ "$(field ip "$out")" = 10.0.0.7 ] && pass "dnsmasq up: $out" || { fail "dnsmasq: $out"; exit 1; }

# 1. Absolute, partial and short names; the last two only through the search list.
for n in other.ns1.svc.k8s.test. other.ns1 other; do
  out="$("$DRIVER" --timeout-ms 5000 "$n")"
  if [ "$(field ip "$out")" = 10.0.0.7 ] && [ "$(field failures "$out")" = 0 ]; then
    pass "'$n' -> 10.0.0.7 first time"
  else
    fail "'$n': $out"
  fi
done

# 2. The master record appears after 1.5 s: found after retries. The name is built by
#    agent_master_name from hostname job-3 and the search list (namespace ns1, domain k8s.test).
"$DRIVER" --timeout-ms 20000 --master-from-host job-3 >"$T/late.out" &
drv=$!
sleep 1.5
echo "10.0.0.9 job-0.job.ns1.svc.k8s.test" >>"$T/hosts"
kill -HUP "$dns_pid"
wait "$drv"
out="$(cat "$T/late.out")"
f="$(field failures "$out")"; e="$(field elapsed_ms "$out")"
if [ "$(field name "$out")" = job-0.job.ns1.svc.k8s.test. ] && [ "$(field ip "$out")" = 10.0.0.9 ] &&
   [ "${f:-0}" -gt 0 ] && [ "${e:-0}" -ge 1500 ] && [ "${e:-0}" -lt 10000 ]; then
  pass "late record found after $f failed attempts: $out"
else
  fail "late record: $out"
fi

# 3. A name that never appears: fails at the deadline (never before it; 30 s only stops a hang)
#    with the name and the resolver's reason.
out="$("$DRIVER" --timeout-ms 1500 never.ns1.svc.k8s.test.)"
e="$(field elapsed_ms "$out")"
if [[ "$out" == "fail rc=-1 "* ]] &&
   [[ "$out" == *"could not resolve 'never.ns1.svc.k8s.test.' after "*" attempts in "*" s: Name or service not known"* ]] &&
   [ "${e:-0}" -ge 1500 ] && [ "${e:-0}" -lt 30000 ]; then
  pass "missing name reported: $out"
else
  fail "missing name: $out"
fi

# 4. Resolved through the search list, but the port refuses until it listens after 1.2 s.
out="$("$DRIVER" --timeout-ms 15000 --listen-after 1200 store)"
f="$(field failures "$out")"; e="$(field elapsed_ms "$out")"
if [ "$(field ip "$out")" = 127.0.0.1 ] && [ "${f:-0}" -gt 0 ] && [ "${e:-0}" -ge 1200 ]; then
  pass "connect confirmed once listening: $out"
else
  fail "confirm connect: $out"
fi
out="$("$DRIVER" --timeout-ms 800 --listen-after 100000 store)"
if [[ "$out" == *"could not connect to 'store' after "*"resolved to 127.0.0.1 but connect to port "*" failed: Connection refused"* ]]; then
  pass "refused port reported: $out"
else
  fail "refused port: $out"
fi

# 5. The DNS server is gone: retried (EAI_AGAIN), then reported.
kill "$dns_pid"; wait "$dns_pid" 2>/dev/null; dns_pid=
out="$("$DRIVER" --timeout-ms 1500 other)"
a="$(field attempts "$out")"
if [[ "$out" == "fail rc=-1 "*"could not resolve 'other' after "* ]] && [ "${a:-0}" -ge 2 ]; then
  pass "dead DNS server retried and reported: $out"
else
  fail "dead DNS server: $out"
fi

if [ "$fails" -ne 0 ]; then
  echo "dns_test: $fails check(s) failed; dnsmasq log:"; tail -40 "$T/dnsmasq.log"
  exit 1
fi
echo "dns_test: all passed"
