#!/usr/bin/env bash
# The rendered cpu-gloo overlay (kubectl kustomize k8s/overlays/cpu-gloo) run as the cluster would
# run it, with pods simulated by tests/agent/pods/pods.sh (network namespaces, dnsmasq as the
# cluster DNS of the headless Service): for each index i < completions, pod <job>-<i> on its own IP
# runs the container's entrypoint (tdist-agent) with the container's args exactly as rendered and
# the environment the kubelet would give it (podspec.py: POD_NAME <job>-<i>-<5 random>,
# POD_NAMESPACE, POD_IP, JOB_COMPLETION_INDEX, HOSTNAME, PATH; env -i), as the securityContext's
# user (65532, no_new_privs, no capabilities) on a read-only root with tmpfs emptyDirs. Every name,
# port, path, count and argument comes from the rendered YAML (podspec.py summary), none from here.
#
# One substitution, as the image is not built here: the image's /opt/tdist/bin/{tdist-agent,train}
# are copies of the Bazel-built binaries under a per-pod directory D, and the configMap volume's
# mountPath /etc/tdist is D/etc/tdist; strings starting with those paths (the container's args,
# the ConfigMap's agent.yaml text) get D prefixed and nothing else changes.
#
# Checks: while the pods run, another pod (a kubelet stand-in, not in the Service's DNS) probes each
# pod's IP on the container's named ports with the probes' paths (/healthz, /readyz), and scrapes
# the PodMonitor's endpoint (/metrics); every pod but the last is probed before its peers exist
# (readiness never waits on peers), the last one as soon as it starts. Every pod must exit 0 and
# the job must have trained: the C example's "train: OK" line.
#
# With TDIST_SIM_WORKER=torch (simulate_torch_test_*) the job is a user's PyTorch job instead: the
# same manifests with the ConfigMap's command set to the DDP example (examples/torch) and
# TDIST_PYTHON=/opt/tdist/bin/python3 in the container's env, as a user's overlay over an image
# with PyTorch would set them; that interpreter is the PyTorch of $TDIST_TORCH (1.13 or 2.6,
# tests/testlib/torch.sh), run as the pod's user. The job must end with identical parameters.
#
# With TDIST_SIM_OVERLAY=cpu-gloo-spares (simulate_spares_test) the overlay with a warm spare: its
# extra pod must wait as a standby (/status state "standby", no workers) and exit 0 with the
# others. With TDIST_SIM_LOSE=1 as well, pod 1 is deleted mid-training (SIGTERM, as the kubelet
# stops a deleted, evicted or drained pod; the agent exits 143) and its replacement (the same
# index, a new pod name and IP) is started once the standby took group rank 1: the job must
# complete on attempt 1, the replacement waiting as the new standby and exiting 0. The C example
# gets --step-ms 5 there, so that training outlasts the loss (elsewhere --step-ms 1, so that it
# outlasts the probes of the last pod).
# With TDIST_SIM_OVERLAY=cpu-mpi (simulate_mpi_test) the MPI overlay: the agents are the PMIx
# server of the C example's ranks on libtdist's mpi backend (Open MPI), with no mpirun; the
# image's /opt/tdist/lib/libtdist-mpi.so is the Bazel-built plugin (PLUGIN).
#   args: AGENT TRAIN PODSPEC_PY PODS_SH K8S_BASE_KUSTOMIZATION DDP_SCRIPT [PLUGIN]
set -uo pipefail
AGENT="$(realpath "$1")"; TRAIN="$(realpath "$2")"; PODSPEC="$(realpath "$3")"; PODS_SH="$(realpath "$4")"
K8S_SRC="$(dirname "$(dirname "$5")")"; DDP="$(realpath "$6")"
WORKER="${TDIST_SIM_WORKER:-c}"
OVERLAY="overlays/${TDIST_SIM_OVERLAY:-cpu-gloo}"
LOSE="${TDIST_SIM_LOSE:-0}"
T="${TEST_TMPDIR:-$(mktemp -d)}/simulate.$$"
mkdir -p "$T"
fails=0
passes=0
pass() { echo "PASS: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
finish() {
  echo "simulate_test: $passes passed, $fails failed"
  [ "$fails" -eq 0 ]
  exit
}
[ "$(id -u)" -eq 0 ] || { echo "simulate_test: needs root (network namespaces)"; exit 1; }

cp -rL "$K8S_SRC" "$T/k8s"
bins=(--bin "tdist-agent=$AGENT" --bin "train=$TRAIN")
if [ -n "${7:-}" ]; then bins+=(--bin "../lib/libtdist-mpi.so=$(realpath "$7")"); fi
if [ "$WORKER" = torch ]; then
  LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
  [ -f "$LIB/torch.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
  . "$LIB/torch.sh"
  # The image's interpreter: 2.6's is the root's entry script itself (it finds the root by a
  # fixed path); 1.13's a two-line shim, as Python must run from its own prefix.
  if [ "$TORCH_TAG" = torch26 ]; then pybin="$PY"
  else pybin="$T/python3"; printf '#!/bin/sh\nexec /usr/bin/python3 "$@"\n' >"$pybin"; chmod 755 "$pybin"; fi
  bins+=(--bin "python3=$pybin" --bin "ddp_train.py=$DDP")
  sed -i 's|^command: .*|command: [/opt/tdist/bin/ddp_train.py, --steps, "200", --check-fresh-store]|' \
    "$T/k8s/base/agent.yaml"
  sed -i 's|^          env:$|          env:\n            - name: TDIST_PYTHON\n              value: /opt/tdist/bin/python3|' \
    "$T/k8s/base/job.yaml"
  grep -q 'ddp_train.py' "$T/k8s/base/agent.yaml" && grep -q 'TDIST_PYTHON' "$T/k8s/base/job.yaml" ||
    { fail "could not set the PyTorch command in the copied manifests"; finish; }
fi
if [ "$OVERLAY" = overlays/cpu-mpi ]; then
  # MPI: 300 of the overlay's 3000 steps (a step is an Open MPI all-reduce between pods, ~15 ms
  # here); and no leak report at exit from Open MPI's and libpmix's allocations, which would fail
  # the ranks and the agents under ASan (as tests/mpi/mpi_env.sh; the kubelet's env -i drops the
  # test's ASAN_OPTIONS, so it goes into the container's env like TDIST_PYTHON above).
  sed -i 's|--steps, "3000"|--steps, "300"|' "$T/k8s/$OVERLAY/agent.yaml"
  sed -i 's|^          env:$|          env:\n            - name: ASAN_OPTIONS\n              value: detect_leaks=0|' \
    "$T/k8s/base/job.yaml"
  grep -q '"300"' "$T/k8s/$OVERLAY/agent.yaml" && grep -q 'detect_leaks=0' "$T/k8s/base/job.yaml" ||
    { fail "could not shorten the MPI job or set ASAN_OPTIONS in the copied manifests"; finish; }
fi
if [ "$WORKER" = c ]; then
  # The C example trains in a fraction of a second: slow its steps so that the job outlasts the
  # probes of the last pod (1 ms) and, with TDIST_SIM_LOSE, the loss of pod 1 (5 ms).
  cfg="$T/k8s/$OVERLAY/agent.yaml"
  [ -f "$cfg" ] || cfg="$T/k8s/base/agent.yaml"
  ms=1; [ "$LOSE" = 1 ] && ms=5
  sed -i 's|^command: \[\(.*\)\]$|command: [\1, --step-ms, "'"$ms"'"]|' "$cfg"
  grep -q 'step-ms' "$cfg" || { fail "could not add --step-ms to $cfg's command"; finish; }
fi
PY="${PY:-/usr/bin/python3}"
if ! kubectl kustomize "$T/k8s/$OVERLAY" >"$T/rendered.yaml" 2>"$T/render.err"; then
  fail "kubectl kustomize $OVERLAY: $(cat "$T/render.err")"
  finish
fi
# Set by eval of `podspec.py summary`.
job='' svc='' namespace='' completions=0 probes='' scrape=''
summary="$("$PY" "$PODSPEC" summary "$T/rendered.yaml")" || { fail "podspec summary"; finish; }
echo "$summary"
eval "$summary"
# Nothing to check is a failure, not a pass: the Job must have pods, HTTP probes and a scrape
# endpoint (prometheus.io annotations) for the checks below to mean anything.
[ "$completions" -gt 0 ] 2>/dev/null || { fail "$OVERLAY: the rendered Job has no completions"; finish; }
[ -n "$probes" ] || { fail "$OVERLAY: the rendered container has no HTTP probe to check"; finish; }
[ -n "$scrape" ] || { fail "$OVERLAY: the rendered manifests have no scrape endpoint to check"; finish; }
# kubectl applies unnamespaced objects to the context's namespace: any name will do, so not "default".
# shellcheck disable=SC2018 # a DNS label: ASCII a-z on purpose
ns="${namespace:-ns-$(LC_ALL=C tr -dc a-z </dev/urandom | head -c 5)}"

# shellcheck source-path=SCRIPTDIR source=../agent/pods/pods.sh
source "$PODS_SH"
pods_init "$job" "$svc" "$ns" cluster.local || exit 1
# Not under /tmp (a fresh tmpfs in each pod); /srv is also where the PyTorch 2.6 root can see it.
ROOT="$(mktemp -d "$([ -d /srv ] && echo /srv || echo /var/tmp)/tdist-k8s.XXXXXX")"
chmod 755 "$ROOT"
pods_at_exit "rm -rf '$ROOT'"
prober=kubelet
pods_start "$prober" auto nodns >/dev/null || { fail "start the prober pod"; finish; }

# probe_pod NAME IP PID: every probe and the scrape endpoint answer 2xx/3xx (success for the
# kubelet and Prometheus) while the agent PID runs. One curl fetches them all, so that the last
# pod, whose job may finish within a second of its start, is caught running.
probe_pod() {
  local name=$1 ip=$2 pid=$3 path port i ok codes
  local -a urls=() args=()
  while read -r path port; do
    [ -n "$path" ] || continue
    urls+=("http://$ip:$port$path")
    args+=(-o /dev/null "http://$ip:$port$path")
  done <<<"$(printf '%s\n%s\n' "$probes" "$scrape" | sort -u)"
  [ "${#urls[@]}" -gt 0 ] || { fail "$name: no probe or scrape URL to check"; return; }
  for ((i = 0; i < 300; i++)); do
    codes="$(PODS_FG_TIMEOUT=5 pods_exec_fg "$prober" -- curl -s --max-time 2 -w '%{http_code} ' "${args[@]}" 2>/dev/null)"
    ok=1
    for c in $codes; do [[ "$c" =~ ^[23] ]] || ok=0; done
    [ "$(wc -w <<<"$codes")" -eq "${#urls[@]}" ] || ok=0
    [ "$ok" = 1 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  read -r -a codes <<<"$codes"
  for i in "${!urls[@]}"; do
    if [ "$ok" = 1 ]; then
      pass "$name: GET ${urls[$i]} -> ${codes[$i]}"
    else
      fail "$name: GET ${urls[$i]} -> ${codes[$i]:-none} (agent $(kill -0 "$pid" 2>/dev/null && echo running || echo exited))"
    fi
  done
}

declare -a PID IP
for ((i = 0; i < completions; i++)); do
  name="$job-$i"
  IP[i]="$(pods_start "$name")" || { fail "start pod $name"; finish; }
  script="$("$PY" "$PODSPEC" pod "$T/rendered.yaml" --index "$i" --namespace "$ns" --pod-ip "${IP[$i]}" \
    --root "$ROOT" --image-prefix /opt/tdist "${bins[@]}")" ||
    { fail "podspec pod $i"; finish; }
  echo "pod $name: ${IP[$i]}, $script"
  pods_exec "$name" -- bash "$script" >"$T/$name.log" 2>&1
  PID[i]=$PODS_PID
  probe_pod "$name" "${IP[$i]}" "${PID[$i]}"
done

# spares: the rendered agent.yaml's spares (the pods from nnodes on are standbys).
spares="$(sed -n 's/^ *spares: *\([0-9]*\).*/\1/p' "$T/rendered.yaml" | head -1)"
spares="${spares:-0}"
nnodes=$((completions - spares))
http_port="$(awk 'NF == 2 { print $2; exit }' <<<"$probes")" # the agent's HTTP port (the probes')
for ((i = nnodes; i < completions; i++)); do
  st=''
  for ((k = 0; k < 100; k++)); do
    st="$(PODS_FG_TIMEOUT=5 pods_exec_fg "$prober" -- curl -s --max-time 2 "http://${IP[$i]}:$http_port/status" 2>/dev/null)"
    "$PY" -c 'import json,sys; s=json.load(sys.stdin); assert s["state"]=="standby" and s["workers"]==[]' <<<"$st" 2>/dev/null && break
    st="not standby: $st"
    sleep 0.1
  done
  [[ "$st" == "not standby"* ]] && fail "pod $job-$i (a spare) is not a standby: ${st:0:300}" ||
    pass "pod $job-$i waits as a standby (/status state standby, no workers)"
done

if [ "$LOSE" = 1 ]; then
  [ "$spares" -gt 0 ] || { fail "TDIST_SIM_LOSE=1 needs an overlay with spares"; finish; }
  for ((k = 0; k < 600; k++)); do grep -q '^step' "$T/$job-0.log" && break; sleep 0.1; done
  echo "deleting pod $job-1 (SIGTERM) mid-training"
  pods_kill "$job-1" TERM >/dev/null
  wait "${PID[1]}"
  rc=$?
  [ "$rc" -eq 143 ] && pass "deleted pod $job-1 exited 143 (SIGTERM)" || fail "deleted pod $job-1 exited $rc, not 143"
  mv "$T/$job-1.log" "$T/$job-1.deleted.log"
  for ((k = 0; k < 300; k++)); do
    grep -q 'round 1 complete.*group rank 1,' "$T/$job-$nnodes.log" && break
    sleep 0.1
  done
  grep -q 'round 1 complete.*group rank 1,' "$T/$job-$nnodes.log" &&
    pass "the standby $job-$nnodes took group rank 1 in round 1" ||
    fail "the standby $job-$nnodes did not take group rank 1: $(tail -3 "$T/$job-$nnodes.log")"
  IP[1]="$(pods_start "$job-1")" || { fail "start the replacement of $job-1"; finish; }
  script="$("$PY" "$PODSPEC" pod "$T/rendered.yaml" --index 1 --namespace "$ns" --pod-ip "${IP[1]}" \
    --root "$ROOT/replacement" --image-prefix /opt/tdist "${bins[@]}")" || { fail "podspec pod 1"; finish; }
  echo "pod $job-1 (replacement): ${IP[1]}, $script"
  pods_exec "$job-1" -- bash "$script" >"$T/$job-1.log" 2>&1
  PID[1]=$PODS_PID
  for ((k = 0; k < 300; k++)); do grep -q 'standby (no workers)' "$T/$job-1.log" && break; sleep 0.1; done
  grep -q 'standby (no workers)' "$T/$job-1.log" && pass "the replacement $job-1 waits as a standby" ||
    fail "the replacement $job-1 is not a standby: $(tail -3 "$T/$job-1.log")"
fi

# The job takes seconds; a broken one would wait for the rendered rdzv_timeout (minutes): bound it.
deadline=$((SECONDS + ${TDIST_SIM_DEADLINE:-120}))
for ((i = 0; i < completions; i++)); do
  while kill -0 "${PID[$i]}" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
done
for ((i = 0; i < completions; i++)); do
  name="$job-$i"
  if kill -0 "${PID[$i]}" 2>/dev/null; then
    fail "pod $name still running after ${TDIST_SIM_DEADLINE:-120} s: killed"
    pods_kill "$name" TERM >/dev/null 2>&1
  fi
  wait "${PID[$i]}"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    pass "pod $name exited 0"
  else
    fail "pod $name exited $rc"
    tail -20 "$T/$name.log"
  fi
done
if [ "$WORKER" = torch ]; then ok='^done: world .* params identical: True'; else ok='^train: OK'; fi
if [ "$WORKER" = torch ]; then
  grep -qh "^ddp_train: PyTorch $TORCH_VERSION," "$T"/"$job"-*.log &&
    pass "the pods' workers ran PyTorch $TORCH_VERSION" ||
    fail "no worker reported PyTorch $TORCH_VERSION: $(grep -h '^ddp_train: PyTorch' "$T"/"$job"-*.log | head -1)"
fi
[ "$LOSE" = 1 ] && ok="$ok.*(attempt 1)"
if grep -h "$ok" "$T"/"$job"-*.log; then
  pass "the job trained (rank 0's check line)"
else
  fail "no '$ok' line from rank 0"
  for f in "$T"/"$job"-*.log; do echo "== $f"; tail -15 "$f"; done
fi
finish
