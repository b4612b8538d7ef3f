# shellcheck shell=bash
# pods.sh: simulated Kubernetes pods for tdist-agent end-to-end tests, on one machine, with network
# namespaces. Sourced by test scripts (bash, root). One "cluster" netns holds a bridge and a dnsmasq
# that plays the cluster DNS for one headless Service with publishNotReadyAddresses; each pod is a
# netns with a veth into that bridge, its own IP, a kubelet-like /etc/hosts and resolv.conf, and a
# UTS namespace per command so that `hostname` is the pod name (an Indexed Job pod <job>-<idx>).
#
# It must never touch the host's root netns (no link, address, route or sysctl is created or changed
# there: every interface lives in a netns of its own), and it must leave nothing behind: pods_init
# installs EXIT/HUP/INT/TERM traps that call pods_cleanup, and reaps what earlier instances whose
# owner shell died (SIGKILL, e.g. a Bazel timeout) left behind. Concurrent instances never collide:
# netns names carry a per-instance id (tdp-<id>-...), interface names are only unique inside their
# own netns (bridge "br0", pod side "eth0", cluster side "vp<n>"), and each instance has its own DNS.
# Pods reach each other and the DNS server, never the host: 127.0.0.1 in a pod is the pod itself.
#
# API (functions return non-zero with a message on stderr when they fail; all waits are bounded):
#   pods_init JOB SVC NS DOMAIN
#       Create the cluster netns, bridge and dnsmasq (10.X.Y.0/24 random, bridge .1 = nameserver),
#       and the traps. Call it directly in the test's main shell, never in $(...) or a pipeline: the
#       shell that calls it owns the instance. Sets PODS_JOB PODS_SVC PODS_NS PODS_DOMAIN, PODS_ID,
#       PODS_PREFIX (netns name prefix), PODS_CLUSTER_NETNS, PODS_DIR (state + dnsmasq.log),
#       PODS_SUBNET ("10.X.Y"), PODS_DNS_IP. One instance per shell.
#   pods_start NAME [IP_SUFFIX|auto] [nodns]  ->  stdout: the pod IP
#       Create pod NAME (a DNS label): netns, veth, IP (a new one each time unless IP_SUFFIX 2..254 is
#       given), lo up, default route via the bridge, /etc/netns/<netns>/{resolv.conf,hosts}. Unless
#       "nodns", publish "<IP> NAME.SVC.NS.svc.DOMAIN SVC.NS.svc.DOMAIN <aliases>" and return once the
#       cluster DNS answers it. Safe in $(...) (all state is in files).
#   pods_exec NAME [VAR=VALUE...] -- CMD [ARG...]
#       Start CMD in pod NAME in the background with hostname NAME and the pod's resolv.conf and hosts
#       (ip netns exec + unshare --uts). Sets PODS_PID to its pid: the pid of CMD itself (every step
#       execs), a child of the calling shell, so `wait "$PODS_PID"` gives CMD's exit status and
#       `kill -TERM "$PODS_PID"` reaches CMD. Prints nothing; redirect it like any command
#       (pods_exec job-0 -- prog >"$log" 2>&1). Do not call it in $(...): the child would belong to
#       the subshell. The environment is the caller's plus the VAR=VALUE pairs. Returns once the
#       process is inside the pod's netns (so a pods_kill right after it cannot miss it).
#   pods_exec_fg NAME [VAR=VALUE...] -- CMD [ARG...]
#       The same in the foreground; returns CMD's status. Bounded by PODS_FG_TIMEOUT seconds
#       (default 60; 124 when it ran out).
#   pods_kill NAME [SIGNAL]
#       Send SIGNAL (default KILL) to every process in the pod's netns (`ip netns pids`), SIGKILL
#       what is left after PODS_KILL_GRACE seconds (default 5), then delete the pod: netns, veth,
#       /etc/netns files, DNS record (returns once DNS no longer answers it). A later pods_start NAME
#       gives the pod a new IP, like a rescheduled pod.
#   pods_dns_unpublish NAME / pods_dns_publish NAME
#       Remove / add the running pod's records (a Ready-gated Service, DNS lag); both return once the
#       cluster DNS agrees.
#   pods_dns_alias NAME FQDN...
#       Extra names for pod NAME's current IP (e.g. a Kubeflow per-replica Service <job>-master-0.NS.
#       svc.DOMAIN); they follow the pod across restarts.
#   pods_ip NAME, pods_fqdn NAME, pods_netns NAME (for `ip -n`, tc, nsenter), pods_list (running pods)
#   pods_at_exit CMD   register cleanup (eval'd, last first) run by the exit trap before pods_cleanup;
#                      pods_init replaces any EXIT/HUP/INT/TERM trap the script had.
#   pods_cleanup       idempotent: kill everything in the instance's netns, delete them and the
#                      /etc/netns dirs, stop dnsmasq. Called by the traps.
#   pods_dump          state and the dnsmasq log tail on stderr, for failure messages.
#   pods_wait_for FILE PATTERN SECONDS
#                      0 once FILE (a pod's log) has a line matching PATTERN (grep), 1 if it has
#                      none after SECONDS (polled every 0.1 s).
#
# Pitfalls: a bridge takes the lowest MAC of its ports unless given one, so adding or removing a pod
# changes it and the other pods' ARP entry for the nameserver goes stale (~30 s of lost DNS queries):
# br0 gets a fixed MAC. Only `ip netns exec` bind-mounts /etc/netns/<netns>/* over /etc/* (in a
# private mount namespace); `nsenter --net` or `ip -n` do not, so a process entered that way resolves
# with the host's resolv.conf. Files are bind-mounted by inode: rewrite them in place, never by
# rename. A background job of a non-interactive shell ignores SIGINT, so INT does not stop a test
# started with `&`; Bazel sends TERM.

# shellcheck disable=SC2034 # PODS_JOB and others are for the caller.
PODS_REGISTRY=/run/tdist-pods

pods__err() {
  echo "pods: $*" >&2
  return 1
}

pods__need_init() {
  [ -n "${PODS_ID:-}" ] || pods__err "${FUNCNAME[1]}: pods_init has not been called in this shell"
}

# A DNS label as Kubernetes requires for pod and Service names.
pods__check_label() {
  local what="$1" v="$2"
  if [ "${#v}" -gt 63 ] || ! [[ "$v" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]]; then
    pods__err "$what '$v' is not a DNS label (lower-case letters, digits and '-', 1-63 chars)"
    return 1
  fi
}

pods__check_pod() {
  pods__need_init || return 1
  [ -f "$PODS_DIR/pods/$1/ip" ] || pods__err "no running pod '$1' (running: $(pods_list | tr '\n' ' '))"
}

# Start time (clock ticks since boot) of a pid, to tell a live owner from a reused pid.
pods__starttime() {
  local s
  s="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  s="${s##*) }"
  # shellcheck disable=SC2086
  set -- $s
  echo "${20}"
}

# Kill every process in netns NS with SIGNAL, then SIGKILL what is left after GRACE seconds.
pods__kill_netns() {
  local ns="$1" sig="$2" grace="$3" pids i
  # Every command may fail harmlessly (the netns or a process is already gone) and the caller may
  # run under set -e: hence the `|| true`s.
  pids="$(ip netns pids "$ns" 2>/dev/null)" || return 0
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086
  kill -s "$sig" $pids 2>/dev/null || true
  for ((i = 0; i < grace * 50; i++)); do
    pids="$(ip netns pids "$ns" 2>/dev/null)" || true
    [ -n "$pids" ] || return 0
    sleep 0.02
  done
  # shellcheck disable=SC2086
  kill -s KILL $pids 2>/dev/null || true
  for ((i = 0; i < 250; i++)); do
    pids="$(ip netns pids "$ns" 2>/dev/null)" || true
    [ -n "$pids" ] || return 0
    sleep 0.02
  done
  pods__err "netns $ns: processes $pids survived SIGKILL for 5 s"
}

# Delete netns NS and its /etc/netns dir after killing what runs in it.
pods__destroy_netns() {
  pods__kill_netns "$1" KILL 2 || true
  ip netns del "$1" 2>/dev/null || true
  rm -rf "/etc/netns/$1"
  [ ! -e "/run/netns/$1" ] || pods__err "netns $1 could not be deleted"
}

# Remove what instances whose owner shell is dead left behind (the owner was SIGKILLed, so its
# traps never ran). Runs at every pods_init; two concurrent reapers are harmless.
pods__reap_stale() {
  local f ns id pid start
  mkdir -p "$PODS_REGISTRY" || return 1
  for f in /run/netns/tdp-* /etc/netns/tdp-* "$PODS_REGISTRY"/*; do
    [ -e "$f" ] || continue
    ns="${f##*/}"
    id="${ns#tdp-}"
    id="${id%%-*}"
    [[ "$id" =~ ^[0-9a-f]+$ ]] || continue
    if [ -f "$PODS_REGISTRY/$id" ]; then
      read -r pid start <"$PODS_REGISTRY/$id" 2>/dev/null || true
      if [ -n "${pid:-}" ] && [ "$(pods__starttime "$pid")" = "${start:-}" ]; then
        continue
      fi
    fi
    case "$f" in
    /run/netns/*) pods__destroy_netns "$ns" || true ;;
    /etc/netns/*) rm -rf "$f" ;;
    *) ;;
    esac
  done
  # Owner files last: a netns is only reaped while its owner file is absent or stale.
  for f in "$PODS_REGISTRY"/*; do
    [ -f "$f" ] || continue
    read -r pid start <"$f" 2>/dev/null || true
    if [ -z "${pid:-}" ] || [ "$(pods__starttime "$pid")" != "${start:-}" ]; then
      if ! compgen -G "/run/netns/tdp-${f##*/}-*" >/dev/null; then rm -f "$f"; fi
    fi
  done
  return 0
}

# Rewrite the dnsmasq hosts file from the pod state, in place (see Pitfalls), and SIGHUP dnsmasq.
pods__dns_sync() {
  local d name ip svc_fqdn line
  svc_fqdn="$PODS_SVC.$PODS_NS.svc.$PODS_DOMAIN"
  {
    echo "$PODS_DNS_IP pods-dns.invalid"
    for d in "$PODS_DIR"/pods/*/; do
      name="$(basename "$d")"
      [ -f "$d/ip" ] && [ -f "$d/published" ] || continue
      ip="$(cat "$d/ip")"
      line="$ip $(pods_fqdn "$name") $svc_fqdn"
      [ -f "$PODS_DIR/aliases/$name" ] && line="$line $(tr '\n' ' ' <"$PODS_DIR/aliases/$name")"
      echo "$line"
    done
  } >"$PODS_DIR/dns.hosts.new" || return 1
  cat "$PODS_DIR/dns.hosts.new" >"$PODS_DIR/dns.hosts" || return 1
  kill -HUP "$(cat "$PODS_DIR/dnsmasq.pid")" 2>/dev/null ||
    pods__err "dnsmasq (pid file $PODS_DIR/dnsmasq.pid) is not running; see $PODS_DIR/dnsmasq.log"
}

# What the cluster DNS answers for FQDN: its first IPv4 address, or nothing.
pods__dns_query() {
  { ip netns exec "$PODS_CLUSTER_NETNS" getent ahostsv4 "$1." 2>/dev/null | awk 'NR == 1 { print $1 }'; } ||
    true
}

# Wait (5 s at most) until the cluster DNS answers FQDN with WANT ("" = no record).
pods__dns_wait() {
  local fqdn="$1" want="$2" got="" i
  for ((i = 0; i < 250; i++)); do
    got="$(pods__dns_query "$fqdn")"
    [ "$got" = "$want" ] && return 0
    sleep 0.02
  done
  pods__err "DNS: $fqdn answers '${got}' after 5 s, want '${want}' (no record if empty); see $PODS_DIR/dnsmasq.log"
}

pods__on_exit() {
  local rc=$? i
  trap - EXIT HUP INT TERM
  for ((i = ${#PODS_AT_EXIT[@]} - 1; i >= 0; i--)); do
    eval "${PODS_AT_EXIT[i]}" || true
  done
  pods_cleanup || true
  exit "$rc"
}

pods_init() {
  local job="$1" svc="$2" ns="$3" domain="$4" i tries start tmp owner="$BASHPID"
  if [ $# -ne 4 ]; then
    pods__err "usage: pods_init JOB SVC NS DOMAIN (got $# arguments)"
    return 1
  fi
  [ -z "${PODS_ID:-}" ] || pods__err "pods_init: instance $PODS_ID already exists in this shell" || return 1
  [ "$(id -u)" = 0 ] || pods__err "pods_init: network namespaces need root (uid $(id -u))" || return 1
  for i in ip dnsmasq unshare getent hostname timeout; do
    command -v "$i" >/dev/null || pods__err "pods_init: '$i' is not installed" || return 1
  done
  pods__check_label job "$job" && pods__check_label service "$svc" && pods__check_label namespace "$ns" ||
    return 1
  [[ "$domain" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || pods__err "pods_init: bad DNS domain '$domain'" ||
    return 1
  # nscd would answer pods from the host's cache through its socket on the shared filesystem.
  if pgrep -x nscd >/dev/null; then
    pods__err "pods_init: nscd is running (pid $(pgrep -x nscd | tr '\n' ' ')): pods would get its cached" \
      "host answers instead of the cluster DNS; stop nscd or disable its hosts cache" || return 1
  fi
  pods__reap_stale || return 1

  # Claim a unique id: the owner file is created exclusively, before any netns that carries the id.
  start="$(pods__starttime "$owner")" || return 1
  for ((tries = 0; tries < 20; tries++)); do
    PODS_ID="$(printf '%x%04x' "$owner" "$((RANDOM * 2 + RANDOM % 2))")"
    if (set -C && echo "$owner $start" >"$PODS_REGISTRY/$PODS_ID") 2>/dev/null; then break; fi
    PODS_ID=""
  done
  [ -n "$PODS_ID" ] || pods__err "pods_init: no free instance id in $PODS_REGISTRY" || return 1

  PODS_JOB="$job" PODS_SVC="$svc" PODS_NS="$ns" PODS_DOMAIN="$domain"
  PODS_PREFIX="tdp-$PODS_ID-"
  PODS_CLUSTER_NETNS="${PODS_PREFIX}cluster"
  PODS_SUBNET="10.$((64 + RANDOM % 190)).$((RANDOM % 256))"
  PODS_DNS_IP="$PODS_SUBNET.1"
  PODS_AT_EXIT=()
  PODS_PID=""
  tmp="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
  PODS_DIR="$(mktemp -d "$tmp/pods.$PODS_ID.XXXXXX")" || pods__err "pods_init: mktemp in $tmp" || return 1
  mkdir -p "$PODS_DIR/pods" "$PODS_DIR/aliases" && echo 2 >"$PODS_DIR/next_suffix" &&
    echo 0 >"$PODS_DIR/next_veth" || return 1

  trap pods__on_exit EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM

  local c="$PODS_CLUSTER_NETNS" mac
  # A fixed bridge MAC: by default a bridge takes the lowest MAC of its ports, so it changes when a
  # pod goes or comes, and the other pods' ARP entry for the nameserver/gateway goes stale for ~30 s
  # (their DNS queries vanish and getaddrinfo times out).
  mac="$(printf '02:%02x:%02x:%02x:%02x:%02x' $((RANDOM % 256)) $((RANDOM % 256)) $((RANDOM % 256)) \
    $((RANDOM % 256)) $((RANDOM % 256)))"
  ip netns add "$c" || pods__err "pods_init: ip netns add $c failed" || return 1
  mkdir -p "/etc/netns/$c" &&
    printf 'nameserver %s\noptions timeout:1 attempts:1\n' "$PODS_DNS_IP" >"/etc/netns/$c/resolv.conf" &&
    printf '127.0.0.1\tlocalhost\n' >"/etc/netns/$c/hosts" || return 1
  ip -n "$c" link set lo up &&
    ip -n "$c" link add name br0 address "$mac" type bridge &&
    ip -n "$c" addr add "$PODS_DNS_IP/24" dev br0 &&
    ip -n "$c" link set br0 up || pods__err "pods_init: bridge setup in netns $c failed" || return 1

  echo "$PODS_DNS_IP pods-dns.invalid" >"$PODS_DIR/dns.hosts"
  # --local=/#/: no upstream, every name outside the hosts file is an immediate NXDOMAIN (CoreDNS
  # would forward; a pod must not wait on a timeout). TTLs 1 s and no negative cache: a rescheduled
  # pod's new IP is visible at once. --user=root: $TEST_TMPDIR is not readable by nobody.
  ip netns exec "$c" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
    --addn-hosts="$PODS_DIR/dns.hosts" --listen-address="$PODS_DNS_IP" --bind-interfaces --port=53 \
    --local=/#/ --local-ttl=1 --neg-ttl=1 --no-negcache --log-queries \
    --log-facility="$PODS_DIR/dnsmasq.log" --pid-file="$PODS_DIR/dnsmasq.pid" \
    --user=root --group=root </dev/null >>"$PODS_DIR/dnsmasq.out" 2>&1 &
  disown $! # no "Killed" job notice when pods_cleanup stops it
  for ((i = 0; i < 250; i++)); do
    [ -s "$PODS_DIR/dnsmasq.pid" ] && [ "$(pods__dns_query pods-dns.invalid)" = "$PODS_DNS_IP" ] && break
    [ -e "/proc/$!" ] || break
    sleep 0.02
  done
  [ "$(pods__dns_query pods-dns.invalid)" = "$PODS_DNS_IP" ] ||
    pods__err "pods_init: dnsmasq did not answer on $PODS_DNS_IP:53 within 5 s:" \
      "$(cat "$PODS_DIR/dnsmasq.out" "$PODS_DIR/dnsmasq.log" 2>/dev/null | tail -5)" || return 1
}

pods_fqdn() { echo "$1.$PODS_SVC.$PODS_NS.svc.$PODS_DOMAIN"; }
pods_netns() { echo "$PODS_PREFIX$1"; }

pods_ip() {
  pods__check_pod "$1" || return 1
  cat "$PODS_DIR/pods/$1/ip"
}

pods_list() {
  local d
  [ -n "${PODS_ID:-}" ] || return 0
  for d in "$PODS_DIR"/pods/*/; do
    [ -f "$d/ip" ] && basename "$d"
  done
  return 0
}

# Remove pod NAME's netns, files and DNS records (what pods_start created, in any partial state).
pods__remove_pod() {
  local name="$1" ns published=""
  ns="$(pods_netns "$name")"
  pods__destroy_netns "$ns" || return 1
  [ -f "$PODS_DIR/pods/$name/published" ] && published=1
  rm -rf "$PODS_DIR/pods/$name"
  if [ -n "$published" ]; then
    pods__dns_sync && pods__dns_wait "$(pods_fqdn "$name")" "" || return 1
  fi
}

pods_start() {
  local name="$1" want="${2:-auto}" dns="${3:-}" ip suffix veth ns d f
  pods__need_init && pods__check_label pod "$name" || return 1
  case "$dns" in "" | nodns) ;; *) pods__err "pods_start $name: third argument '$dns' is not 'nodns'" || return 1 ;; esac
  d="$PODS_DIR/pods/$name"
  [ ! -e "$d" ] || pods__err "pods_start: pod '$name' is already running ($(cat "$d/ip" 2>/dev/null))" || return 1
  local used=" "
  for f in "$PODS_DIR"/pods/*/ip; do [ -f "$f" ] && used="$used$(cat "$f") "; done
  if [ "$want" = auto ]; then
    suffix="$(cat "$PODS_DIR/next_suffix")"
    while [[ "$used" == *" $PODS_SUBNET.$suffix "* ]]; do suffix=$((suffix + 1)); done
    [ "$suffix" -le 254 ] || pods__err "pods_start $name: the /24 has no fresh address left" || return 1
    echo $((suffix + 1)) >"$PODS_DIR/next_suffix"
  else
    [[ "$want" =~ ^[0-9]+$ ]] && [ "$want" -ge 2 ] && [ "$want" -le 254 ] ||
      pods__err "pods_start $name: IP suffix '$want' is not 2..254 or 'auto'" || return 1
    [[ "$used" != *" $PODS_SUBNET.$want "* ]] ||
      pods__err "pods_start $name: $PODS_SUBNET.$want is in use by another pod" || return 1
    suffix="$want"
  fi
  ip="$PODS_SUBNET.$suffix"
  # Cluster-side veth names are never reused: a deleted netns frees its veth asynchronously.
  veth="vp$(cat "$PODS_DIR/next_veth")"
  echo $((${veth#vp} + 1)) >"$PODS_DIR/next_veth"
  ns="$(pods_netns "$name")"

  mkdir -p "$d" && echo "$veth" >"$d/veth" || return 1
  if ! {
    ip netns add "$ns" &&
      mkdir -p "/etc/netns/$ns" &&
      printf 'search %s.svc.%s svc.%s %s\nnameserver %s\noptions ndots:5\n' \
        "$PODS_NS" "$PODS_DOMAIN" "$PODS_DOMAIN" "$PODS_DOMAIN" "$PODS_DNS_IP" >"/etc/netns/$ns/resolv.conf" &&
      printf '%s\n' "# Kubernetes-managed hosts file (simulated by tests/agent/pods/pods.sh)." \
        "127.0.0.1	localhost" "::1	localhost ip6-localhost ip6-loopback" "fe00::0	ip6-localnet" \
        "fe00::0	ip6-mcastprefix" "fe00::1	ip6-allnodes" "fe00::2	ip6-allrouters" \
        "$ip	$(pods_fqdn "$name")	$name" >"/etc/netns/$ns/hosts" &&
      ip -n "$PODS_CLUSTER_NETNS" link add name "$veth" type veth peer name eth0 netns "$ns" &&
      ip -n "$PODS_CLUSTER_NETNS" link set "$veth" master br0 up &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" addr add "$ip/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip -n "$ns" route add default via "$PODS_DNS_IP"
  }; then
    pods__remove_pod "$name"
    pods__err "pods_start $name: creating netns $ns with $ip failed (see the ip error above)"
    return 1
  fi
  echo "$ip" >"$d/ip"
  if [ "$dns" != nodns ]; then
    pods_dns_publish "$name" || return 1
  fi
  echo "$ip"
}

pods_dns_publish() {
  pods__check_pod "$1" || return 1
  touch "$PODS_DIR/pods/$1/published" && pods__dns_sync &&
    pods__dns_wait "$(pods_fqdn "$1")" "$(cat "$PODS_DIR/pods/$1/ip")"
}

pods_dns_unpublish() {
  pods__check_pod "$1" || return 1
  rm -f "$PODS_DIR/pods/$1/published" && pods__dns_sync && pods__dns_wait "$(pods_fqdn "$1")" ""
}

pods_dns_alias() {
  local name="$1" a
  pods__need_init && pods__check_label pod "$name" || return 1
  shift
  for a in "$@"; do
    [[ "$a" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || pods__err "pods_dns_alias $name: bad name '$a'" || return 1
    echo "$a" >>"$PODS_DIR/aliases/$name"
  done
  pods__dns_sync || return 1
  if [ -f "$PODS_DIR/pods/$name/published" ]; then
    for a in "$@"; do pods__dns_wait "$a" "$(cat "$PODS_DIR/pods/$name/ip")" || return 1; done
  fi
}

# Shared by pods_exec and pods_exec_fg: splits "[VAR=VALUE...] -- CMD..." into pods__envs/pods__cmd.
pods__exec_args() {
  local who="$1" name="$2"
  shift 2
  pods__check_pod "$name" || return 1
  pods__envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] ||
      pods__err "$who $name: '$1' is not VAR=VALUE (put '--' before the command)" || return 1
    pods__envs+=("$1")
    shift
  done
  [ "${1:-}" = -- ] && [ $# -ge 2 ] || pods__err "$who $name: usage: $who NAME [VAR=VALUE...] -- CMD [ARG...]" ||
    return 1
  shift
  pods__cmd=("$@")
}

# sh inside the pod: set the hostname in the new UTS namespace, export the pairs, exec the command.
# shellcheck disable=SC2016
pods__in_pod='hostname "$0" || exit 127; n=$1; shift
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
exec "$@"'

pods_exec() {
  local name="$1"
  pods__exec_args pods_exec "$@" || return 1
  ip netns exec "$(pods_netns "$name")" unshare --uts sh -c "$pods__in_pod" "$name" \
    "${#pods__envs[@]}" "${pods__envs[@]}" "${pods__cmd[@]}" &
  PODS_PID=$!
  echo "$PODS_PID" >>"$PODS_DIR/pods/$name/pids"
  pods__wait_in_netns "$PODS_PID" "$(pods_netns "$name")"
}

# Return once process PID is inside netns NS (or has exited). Until `ip netns exec` has called
# setns(), the child is in the root netns, invisible to `ip netns pids`: a pods_kill right after
# pods_exec would miss it, and it could then enter the deleted netns and outlive the pod.
pods__wait_in_netns() {
  local pid="$1" want i
  want="net:[$(stat -L -c %i "/run/netns/$2")]" || return 1
  for ((i = 0; i < 1000; i++)); do
    [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$want" ] && return 0
    [ -e "/proc/$pid/ns/net" ] || return 0
    sleep 0.005
  done
  pods__err "pods_exec: pid $pid did not enter netns $2 within 5 s"
}

pods_exec_fg() {
  local name="$1"
  pods__exec_args pods_exec_fg "$@" || return 1
  timeout --kill-after=2 "${PODS_FG_TIMEOUT:-60}" ip netns exec "$(pods_netns "$name")" unshare --uts \
    sh -c "$pods__in_pod" "$name" "${#pods__envs[@]}" "${pods__envs[@]}" "${pods__cmd[@]}"
}

pods_kill() {
  local name="$1" sig="${2:-KILL}"
  pods__check_pod "$name" || return 1
  pods__kill_netns "$(pods_netns "$name")" "$sig" "${PODS_KILL_GRACE:-5}" || true
  pods__remove_pod "$name"
}

pods_at_exit() {
  pods__need_init || return 1
  PODS_AT_EXIT+=("$*")
}

pods_wait_for() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

pods_dump() {
  [ -n "${PODS_ID:-}" ] || return 0
  {
    echo "--- pods instance $PODS_ID: subnet $PODS_SUBNET.0/24, DNS $PODS_DNS_IP, state $PODS_DIR"
    local n
    for n in $(pods_list); do echo "pod $n $(cat "$PODS_DIR/pods/$n/ip") netns $(pods_netns "$n")"; done
    echo "--- dns.hosts:"
    cat "$PODS_DIR/dns.hosts"
    echo "--- dnsmasq.log (last 30 lines):"
    tail -n 30 "$PODS_DIR/dnsmasq.log" 2>/dev/null
  } >&2
}

pods_cleanup() {
  local ns rc=0 f
  [ -n "${PODS_ID:-}" ] || return 0
  # Pods first, the cluster netns (dnsmasq, bridge) last.
  for f in /run/netns/"$PODS_PREFIX"*; do
    [ -e "$f" ] || continue
    ns="${f##*/}"
    [ "$ns" = "$PODS_CLUSTER_NETNS" ] && continue
    pods__destroy_netns "$ns" || rc=1
  done
  pods__destroy_netns "$PODS_CLUSTER_NETNS" || rc=1
  rm -rf /etc/netns/"$PODS_PREFIX"*
  [ "$rc" = 0 ] && rm -f "$PODS_REGISTRY/$PODS_ID"
  PODS_ID=""
  return "$rc"
}
