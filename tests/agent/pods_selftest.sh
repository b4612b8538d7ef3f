#!/usr/bin/env bash
# Self-test of the simulated-pods harness (tests/agent/pods/pods.sh) that the tdist-agent end-to-end
# tests run on: three pods job-0..2 of one Indexed Job behind a headless Service; names resolve from
# inside a pod through the bind-mounted resolv.conf (FQDN, short name through the search list, the
# Service name), the hostname is the pod name, a TCP listener in one pod is reachable by name from
# another, environment pairs reach the command, a killed and restarted pod gets a new IP that DNS
# serves within 2 s while the old IP is gone, Ready-gated publishing and aliases work, and cleanup
# leaves no netns, /etc/netns dir, dnsmasq or owner file behind. Then two instances run at the same
# time with the same names (no collision), and an instance whose owner was SIGKILLed is reaped by
# the next pods_init. The host's root netns must be byte-for-byte unchanged at the end.
#
# usage: pods_selftest.sh PODS_SH
set -euo pipefail

lib="${1:-$(dirname "$0")/pods/pods.sh}"
# shellcheck source=SCRIPTDIR/pods/pods.sh
source "$lib"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
py=/usr/bin/python3 # the python3 first on PATH is a pyenv shim
svc=svc$RANDOM
ns=ns$RANDOM
domain=cluster.local

fail() {
  echo "FAIL: $*" >&2
  pods_dump
  exit 1
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Everything about the root netns that the harness must not change. podman's bridges and veths (podmanN,
# vethN) are left out: the container tests beside this one in `bazel test //...` add and remove
# them at any moment (a run saw podman6 go mid-test), and pods.sh never makes such names in the
# root netns (its veths are vp<N> in its cluster netns).
host_net() {
  {
    ip -o link show | awk -F': ' '{ print $2 }' | sort
    ip -o addr show | awk '{ print $2, $3, $4 }' | sort
    ip route show table all
    ip rule show
  } | grep -Ev '\b(podman|veth)[0-9]+\b'
  cat /proc/sys/net/ipv4/ip_forward
}

# A TCP server in pod $1 on port $2 answering "<hostname> $3" to each connection; waits until it
# listens. Sets $server_pid.
start_server() {
  local pod="$1" port="$2" token="$3" ready="$tmp/ready.$1.$RANDOM" i
  pods_exec "$pod" -- "$py" -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
open(sys.argv[3], "w").close()
while True:
    c, _ = s.accept()
    c.sendall(("%s %s\n" % (socket.gethostname(), sys.argv[2])).encode())
    c.close()
' "$port" "$token" "$ready" 2>"$tmp/server.$pod.err"
  server_pid="$PODS_PID"
  for ((i = 0; i < 250; i++)); do
    [ -e "$ready" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || fail "server in $pod exited: $(cat "$tmp/server.$pod.err")"
    sleep 0.02
  done
  fail "server in $pod not listening after 5 s"
}

# Connect from pod $1 to host $2 port $3 (name or IP) with timeout $4 s; prints the greeting.
connect() {
  pods_exec_fg "$1" -- "$py" -c '
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
print(c.recv(200).decode().strip())
' "$2" "$3" "$4"
}

# What pod $1 resolves $2 to (first address of `getent hosts`, i.e. glibc getaddrinfo/gethostbyname2).
resolve() { pods_exec_fg "$1" -- getent hosts "$2" | awk 'NR == 1 { print $1 }' || true; }

# Whether pid $1 exists and is not a zombie.
running() { [ -e "/proc/$1/stat" ] && [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# The state an instance leaves must be gone: $1 = its netns prefix, $2 = its state dir, $3 = its id.
assert_gone() {
  local prefix="$1" dir="$2" id="$3" pid i
  ! ip netns list | grep -q "^$prefix" || fail "netns left behind: $(ip netns list | grep "^$prefix")"
  ! compgen -G "/etc/netns/$prefix*" >/dev/null || fail "/etc/netns dirs left: $(ls -d "/etc/netns/$prefix"*)"
  [ ! -e "/run/tdist-pods/$id" ] || fail "owner file /run/tdist-pods/$id left behind"
  pid="$(cat "$dir/dnsmasq.pid" 2>/dev/null || true)"
  [ -n "$pid" ] || fail "no dnsmasq pid file in $dir"
  # A zombie counts as gone: an orphan's new parent (PID 1 here) may be slow to reap it. A killed
  # process leaves its netns (and `ip netns pids`) before it is a zombie: allow it 2 s to finish.
  for ((i = 0; i < 100; i++)); do
    running "$pid" || break
    sleep 0.02
  done
  if running "$pid"; then
    fail "dnsmasq $pid of $dir still running: $(cat "/proc/$pid/stat" 2>/dev/null)"
  fi
  ! pgrep -f -- "--addn-hosts=$dir/" >/dev/null || fail "a dnsmasq for $dir is still running: $(pgrep -af "$dir")"
}

host_before="$(host_net)"
t_start="$(now_ms)"

# --- one instance, three pods ----------------------------------------------------------------
pods_init job "$svc" "$ns" "$domain"
fq() { echo "$1.$svc.$ns.svc.$domain"; }
ip0="$(pods_start job-0 auto)"
ip1="$(pods_start job-1 auto)"
ip2="$(pods_start job-2 auto)"
[ "$(pods_ip job-1)" = "$ip1" ] || fail "pods_ip job-1 = $(pods_ip job-1), pods_start said $ip1"
for ip in "$ip0" "$ip1" "$ip2"; do
  [[ "$ip" == "$PODS_SUBNET".* ]] || fail "pod IP $ip is not in $PODS_SUBNET.0/24"
done
if [ "$ip0" = "$ip1" ] || [ "$ip1" = "$ip2" ] || [ "$ip0" = "$ip2" ]; then fail "IPs not distinct: $ip0 $ip1 $ip2"; fi
[ "$(pods_list | tr '\n' ' ')" = "job-0 job-1 job-2 " ] || fail "pods_list: $(pods_list | tr '\n' ' ')"

# The pod sees its own resolv.conf and hosts (bind-mounted by `ip netns exec`), and its hostname.
want_resolv="search $ns.svc.$domain svc.$domain $domain
nameserver $PODS_DNS_IP
options ndots:5"
[ "$(pods_exec_fg job-1 -- cat /etc/resolv.conf)" = "$want_resolv" ] ||
  fail "resolv.conf in job-1: $(pods_exec_fg job-1 -- cat /etc/resolv.conf)"
[ "$(pods_exec_fg job-1 -- hostname)" = job-1 ] || fail "hostname in job-1: $(pods_exec_fg job-1 -- hostname)"
[ "$(hostname)" != job-1 ] || fail "the host's hostname was changed"
[ "$(pods_exec_fg job-1 -- hostname -f)" = "$(fq job-1)" ] ||
  fail "hostname -f in job-1: $(pods_exec_fg job-1 -- hostname -f), want $(fq job-1)"
[ "$(resolve job-1 job-1)" = "$ip1" ] || fail "job-1 resolves its own hostname to $(resolve job-1 job-1), want $ip1"
lh="$(pods_exec_fg job-1 -- getent ahostsv4 localhost | awk 'NR == 1 { print $1 }')"
[ "$lh" = 127.0.0.1 ] || fail "localhost (IPv4) in job-1: '$lh'"

# Names of other pods through the cluster DNS: FQDN, short name via the search list, the Service.
[ "$(resolve job-1 "$(fq job-0)")" = "$ip0" ] || fail "job-1: $(fq job-0) -> '$(resolve job-1 "$(fq job-0)")', want $ip0"
[ "$(resolve job-1 "job-0.$svc")" = "$ip0" ] || fail "job-1: job-0.$svc -> '$(resolve job-1 "job-0.$svc")', want $ip0"
[ "$(resolve job-2 "job-1.$svc.$ns")" = "$ip1" ] || fail "job-2: job-1.$svc.$ns -> '$(resolve job-2 "job-1.$svc.$ns")'"
svc_ips="$(pods_exec_fg job-1 -- getent ahostsv4 "$svc" | awk '$2 == "STREAM" { print $1 }' | sort | tr '\n' ' ')"
[ "$svc_ips" = "$(printf '%s\n' "$ip0" "$ip1" "$ip2" | sort | tr '\n' ' ')" ] || fail "Service $svc -> '$svc_ips'"
# Unknown names fail as NXDOMAIN, not a timeout: getent exits 2 (not found), and getaddrinfo's
# error is EAI_NONAME (a timed-out lookup gives EAI_AGAIN); told by the answer, not by the time.
rc=0
pods_exec_fg job-1 -- getent hosts "job-9.$svc" >/dev/null || rc=$?
[ "$rc" = 2 ] || fail "getent of a missing pod exited $rc, want 2 (not found)"
gai="$(pods_exec_fg job-1 -- /usr/bin/python3 -c 'import socket, sys
try: socket.getaddrinfo(sys.argv[1], None)
except socket.gaierror as e: print(e.errno)
else: print("found")' "job-9.$svc")"
[ "$gai" = "$(/usr/bin/python3 -c 'import socket; print(socket.EAI_NONAME)')" ] ||
  fail "a missing name: getaddrinfo error '$gai', want EAI_NONAME (NXDOMAIN), not EAI_AGAIN (timeout)"
rc=0
pods_exec_fg job-1 -- getent hosts example.com >/dev/null || rc=$?
[ "$rc" = 2 ] || fail "getent example.com exited $rc, want 2: the cluster DNS must not forward"

# Environment pairs, and the exit status of a foreground command.
v="a b'\"\$x $RANDOM"
# shellcheck disable=SC2016 # expanded inside the pod
[ "$(pods_exec_fg job-2 "TDIST_V=$v" B=2 -- sh -c 'echo "$TDIST_V|$B"')" = "$v|2" ] || fail "env pairs not passed"
rc=0
pods_exec_fg job-2 -- sh -c 'exit 7' || rc=$?
[ "$rc" = 7 ] || fail "pods_exec_fg returned $rc, want 7"
rc=0
pods_exec_fg job-2 B=1 -- >/dev/null 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "pods_exec_fg without a command returned $rc, want a usage error"
rc=0
pods_exec_fg job-7 -- true 2>/dev/null || rc=$?
[ "$rc" = 1 ] || fail "pods_exec_fg in a missing pod returned $rc, want 1"

# A TCP listener in job-0, reached by name from job-2; the pod cannot see the host's loopback.
port=$((20000 + RANDOM % 40000)) # a private netns: no other test can hold this port
token="t$RANDOM"
start_server job-0 "$port" "$token"
old_server="$server_pid"
[ "$(connect job-2 "job-0.$svc" "$port" 5)" = "job-0 $token" ] || fail "job-2 -> job-0.$svc:$port failed"
[ "$(connect job-2 "$(fq job-0)" "$port" 5)" = "job-0 $token" ] || fail "job-2 -> $(fq job-0):$port failed"
connect job-2 127.0.0.1 "$port" 1 >/dev/null 2>&1 && fail "job-2 reached job-0's listener on its own 127.0.0.1"

# Kill job-0 and start it again: a new IP, DNS follows within 2 s, the old IP is gone.
pods_kill job-0
rc=0
wait "$old_server" || rc=$?
[ "$rc" = 137 ] || fail "job-0's server exited $rc after pods_kill, want 137 (SIGKILL)"
! ip netns list | grep -q "^$(pods_netns job-0)" || fail "netns of job-0 still exists after pods_kill"
[ ! -e "/etc/netns/$(pods_netns job-0)" ] || fail "/etc/netns dir of job-0 still exists after pods_kill"
rc=0
pods_exec_fg job-1 -- getent hosts "job-0.$svc" >/dev/null || rc=$?
[ "$rc" = 2 ] || fail "job-0.$svc still resolves after pods_kill (getent exit $rc)"
t_kill="$(now_ms)"
new0="$(pods_start job-0 auto)"
[ "$new0" != "$ip0" ] || fail "restarted job-0 got its old IP $ip0"
got=""
while [ $(($(now_ms) - t_kill)) -lt 2000 ]; do
  got="$(resolve job-1 "job-0.$svc")"
  [ "$got" = "$new0" ] && break
done
[ "$got" = "$new0" ] || fail "job-1: job-0.$svc -> '$got' 2 s after the restart, want $new0"
for p in $(pods_list); do
  ! ip -n "$(pods_netns "$p")" -4 -o addr show | grep -q " $ip0/" || fail "old IP $ip0 still on pod $p"
done
start_server job-0 "$port" "$token-2"
[ "$(connect job-2 "job-0.$svc" "$port" 5)" = "job-0 $token-2" ] || fail "job-2 -> restarted job-0 failed"
connect job-2 "$ip0" "$port" 0.5 >/dev/null 2>&1 && fail "job-2 still reaches the old IP $ip0"

# SIGTERM through pods_kill; a fixed IP suffix; Ready-gated publishing; an alias that follows the pod.
pods_start job-3 200 nodns >/dev/null
[ "$(pods_ip job-3)" = "$PODS_SUBNET.200" ] || fail "job-3 with suffix 200 got $(pods_ip job-3)"
pods_start job-4 200 2>/dev/null && fail "a second pod got the IP suffix 200"
[ -z "$(resolve job-1 "job-3.$svc")" ] || fail "nodns job-3 resolves before pods_dns_publish"
pods_dns_publish job-3
[ "$(resolve job-1 "job-3.$svc")" = "$PODS_SUBNET.200" ] || fail "job-3 does not resolve after pods_dns_publish"
pods_dns_unpublish job-3
[ -z "$(resolve job-1 "job-3.$svc")" ] || fail "job-3 still resolves after pods_dns_unpublish"
pods_exec job-3 -- sleep 60
sleeper="$PODS_PID"
pods_kill job-3 TERM
rc=0
wait "$sleeper" || rc=$?
[ "$rc" = 143 ] || fail "sleep in job-3 exited $rc after pods_kill TERM, want 143"
pods_dns_alias job-2 "job-master-0.$ns.svc.$domain"
[ "$(resolve job-0 job-master-0)" = "$ip2" ] || fail "alias job-master-0 -> '$(resolve job-0 job-master-0)'"
pods_kill job-2
new2="$(pods_start job-2 auto)"
[ "$(resolve job-0 job-master-0)" = "$new2" ] || fail "alias job-master-0 did not follow job-2 to $new2"

# Cleanup leaves nothing; a second call is a no-op.
pods_exec job-1 -- sleep 60
prefix="$PODS_PREFIX" dir="$PODS_DIR" id="$PODS_ID"
pods_cleanup
pods_cleanup
assert_gone "$prefix" "$dir" "$id"
[ -z "${PODS_ID:-}" ] || fail "PODS_ID still set after pods_cleanup"
wait || true
[ "$host_before" = "$(host_net)" ] || fail "root netns changed"$'\n'"before: $host_before"$'\n'"after: $(host_net)"
echo "single instance: ok ($(($(now_ms) - t_start)) ms)"

# --- two instances at the same time, same names ----------------------------------------------
# Each runs in a subshell of its own with its own traps, and exits through them.
instance() {
  local tag="$1" a b port=$((20000 + RANDOM % 40000))
  pods_init job "$svc" "$ns" "$domain"
  echo "$PODS_PREFIX $PODS_DIR $PODS_ID $PODS_SUBNET" >"$tmp/inst.$tag"
  a="$(pods_start job-0 auto)"
  b="$(pods_start job-1 auto)"
  [ "$(resolve job-1 "job-0.$svc")" = "$a" ] || fail "[$tag] job-0.$svc -> '$(resolve job-1 "job-0.$svc")', want $a"
  start_server job-0 "$port" "$tag"
  [ "$(connect job-1 "job-0.$svc" "$port" 5)" = "job-0 $tag" ] || fail "[$tag] job-1 -> job-0 failed"
  pods_kill job-0
  a="$(pods_start job-0 auto)"
  [ "$(resolve job-1 "job-0.$svc")" = "$a" ] || fail "[$tag] restarted job-0.$svc -> '$(resolve job-1 "job-0.$svc")'"
  [ -n "$b" ] || fail "[$tag] no IP for job-1"
  pods_exec job-1 -- sleep 60 # left running: the exit trap must kill it
}
t0="$(now_ms)"
(instance A) >"$tmp/inst.A.log" 2>&1 &
pid_a=$!
(instance B) >"$tmp/inst.B.log" 2>&1 &
pid_b=$!
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
[ "$rc_a" = 0 ] || fail "instance A exited $rc_a: $(cat "$tmp/inst.A.log")"
[ "$rc_b" = 0 ] || fail "instance B exited $rc_b: $(cat "$tmp/inst.B.log")"
read -r prefix_a dir_a id_a _ <"$tmp/inst.A"
read -r prefix_b dir_b id_b _ <"$tmp/inst.B"
[ "$prefix_a" != "$prefix_b" ] || fail "both instances used netns prefix $prefix_a"
assert_gone "$prefix_a" "$dir_a" "$id_a"
assert_gone "$prefix_b" "$dir_b" "$id_b"
echo "two concurrent instances: ok ($(($(now_ms) - t0)) ms)"

# --- an owner killed by SIGKILL: the next pods_init reaps what it left -----------------------
(
  pods_init job "$svc" "$ns" "$domain"
  echo "$PODS_PREFIX $PODS_DIR $PODS_ID" >"$tmp/inst.K"
  pods_start job-0 auto >/dev/null
  pods_exec job-0 -- sleep 60
  kill -KILL "$BASHPID"
) >"$tmp/inst.K.log" 2>&1 || true
read -r prefix_k dir_k id_k <"$tmp/inst.K" || fail "the SIGKILLed instance did not start: $(cat "$tmp/inst.K.log")"
ip netns list | grep -q "^${prefix_k}job-0" || fail "the SIGKILLed instance left no netns (test is void)"
(
  pods_init job "$svc" "$ns" "$domain"
  assert_gone "$prefix_k" "$dir_k" "$id_k"
) || fail "pods_init did not reap the SIGKILLed instance ${prefix_k}*"
wait || true

[ "$host_before" = "$(host_net)" ] || fail "root netns changed"$'\n'"before: $host_before"$'\n'"after: $(host_net)"
echo "PASS ($(($(now_ms) - t_start)) ms)"
