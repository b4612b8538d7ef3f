#!/usr/bin/env bash
# What users apply is what is checked: every kustomization under k8s/ (the base and each overlay)
# is rendered with `kubectl kustomize`, exactly as `kubectl apply -k` renders it, and the output
#   1. renders (with every kubectl given: `kubectl` on PATH, plus those in $TDIST_KUBECTLS,
#      colon-separated, e.g. Debian's kubectl 1.20 with kustomize v2: all must agree);
#   2. is read by the agent's own loader: the ConfigMap's agent.yaml, mounted and started as the
#      kubelet would for every pod index (podspec.py: env, args, security context, volumes), must
#      pass `tdist-agent --check-config` (exit 0); and the same pod with one unknown key added to
#      agent.yaml must exit 64, the code the Job's podFailurePolicy fails the job on;
#   3. validates against the Kubernetes OpenAPI schemas (kubernetes-models, npm, at the versions
#      of package-lock.json) with no unknown field, and satisfies tdist's rules (validate.js),
#      compared with the agent's effective configuration from 2; validate.js --self-test shows
#      that each rule catches its violation, on every kustomization.
# Overlays whose name contains "gpu" must be GPU deployments, the others CPU ones.
# Needs root for step 2 (a private mount namespace per pod); without root, steps 2-3 are a skip,
# which fails the test unless TDIST_TEST_ALLOW_SKIP=1 (tests/testlib/skip.sh).
#   args: AGENT TRAIN PODSPEC_PY VALIDATE_JS NPM_DEPS_SH K8S_BASE_KUSTOMIZATION
set -uo pipefail
AGENT="$(realpath "$1")"; TRAIN="$(realpath "$2")"; PODSPEC="$(realpath "$3")"
VALIDATE="$(realpath "$4")"; NPM_DEPS="$(realpath "$5")"
K8S_SRC="$(dirname "$(dirname "$6")")"
PY=/usr/bin/python3
T="${TEST_TMPDIR:-$(mktemp -d)}/render.$$"
mkdir -p "$T"
fails=0
passes=0
pass() { echo "PASS: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
finish() {
  echo "render_test: $passes passed, $fails failed"
  [ "$fails" -eq 0 ]
  exit
}

# Bazel's runfiles are symlinks, which kustomize's load restrictions may reject: render a copy.
cp -rL "$K8S_SRC" "$T/k8s"
kustomizations=(base)
for d in "$T"/k8s/overlays/*/; do kustomizations+=("overlays/$(basename "$d")"); done

kubectls=()
if command -v kubectl >/dev/null; then kubectls+=("$(command -v kubectl)"); fi
IFS=: read -r -a extra <<<"${TDIST_KUBECTLS:-}"
for k in "${extra[@]}"; do [ -n "$k" ] && kubectls+=("$k"); done
if [ "${#kubectls[@]}" -eq 0 ]; then
  fail "no kubectl on PATH (.ci/setup installs Debian's kubernetes-client when none is there)"
  finish
fi

# 1. Render.
for k in "${kubectls[@]}"; do
  echo "kubectl $k: $("$k" version --client 2>/dev/null | tr '\n' ' ')"
done
declare -A rendered
# Set by eval of `podspec.py summary`.
job='' namespace='' completions=0
for kz in "${kustomizations[@]}"; do
  name="$(basename "$kz")"
  ok=1
  for j in "${!kubectls[@]}"; do
    out="$T/$name.$j.yaml"
    if ! "${kubectls[$j]}" kustomize "$T/k8s/$kz" >"$out" 2>"$T/$name.$j.err"; then
      fail "$kz: ${kubectls[$j]} kustomize: $(cat "$T/$name.$j.err")"
      ok=0
      continue
    fi
    if [ "$j" -gt 0 ] && [ -s "$T/$name.0.yaml" ]; then
      if "$PY" "$PODSPEC" same "$T/$name.0.yaml" "$out" 2>"$T/$name.$j.diff"; then
        pass "$kz: ${kubectls[$j]} renders the same objects as ${kubectls[0]}"
      else
        fail "$kz: ${kubectls[$j]} renders differently from ${kubectls[0]}: $(cat "$T/$name.$j.diff")"
        ok=0
      fi
    fi
  done
  if [ "$ok" = 1 ]; then
    pass "$kz renders ($(grep -c '^kind:' "$T/$name.0.yaml") objects)"
    rendered[$name]="$T/$name.0.yaml"
  fi
done

if [ "$(id -u)" -ne 0 ]; then
  LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
  [ -f "$LIB/skip.sh" ] || LIB="$(dirname "$(realpath "$0")")/../testlib"
  . "$LIB/skip.sh"
  test_skip "render_test: steps 2-3 (--check-config in each pod's environment, the schema and" \
    "rule checks): need root; uid $(id -u)" || fails=$((fails + 1))
  finish
fi

# 2. The agent reads each kustomization's configuration, in each pod's environment.
ROOT="$(mktemp -d /var/tmp/tdist-k8s.XXXXXX)"
chmod 755 "$ROOT"
trap 'rm -rf "$ROOT"' EXIT
# pod_script NAME RENDERED INDEX: lays out the pod and prints its launch script.
pod_script() {
  local ns
  ns="$(eval "$("$PY" "$PODSPEC" summary "$2")"; echo "${namespace:-default}")"
  "$PY" "$PODSPEC" pod "$2" --index "$3" --namespace "$ns" --pod-ip "10.244.$3.10" \
    --root "$ROOT/$1" --image-prefix /opt/tdist --bin "tdist-agent=$AGENT" --bin "train=$TRAIN"
}
vargs=()
for kz in "${kustomizations[@]}"; do
  name="$(basename "$kz")"
  [ -n "${rendered[$name]:-}" ] || continue
  eval "$("$PY" "$PODSPEC" summary "${rendered[$name]}")" || { fail "$kz: podspec summary"; continue; }
  ok=1
  for ((i = 0; i < completions; i++)); do
    script="$(pod_script "$name" "${rendered[$name]}" "$i")" || { fail "$kz: pod $i: podspec"; ok=0; continue; }
    # The pod's hostname as an Indexed Job's pod has it (JOB-INDEX): --check-config checks that
    # the store host can be named from it, as a real start does.
    unshare --mount --uts --propagation private \
      sh -c 'hostname "$1" && shift && exec bash "$@"' pod "$job-$i" "$script" --check-config \
      >"$T/$name.effective.$i.yaml" 2>"$T/$name.check.$i.err"
    rc=$?
    if [ "$rc" -ne 0 ]; then
      fail "$kz: pod $job-$i: tdist-agent --check-config exited $rc: $(cat "$T/$name.check.$i.err")"
      ok=0
    fi
  done
  if [ "$ok" = 1 ]; then
    pass "$kz: tdist-agent --check-config accepts agent.yaml in all $completions pods' environments"
    want=cpu
    [[ "$name" == *gpu* ]] && want=gpu
    vargs+=("$name:$want" "${rendered[$name]}" "$T/$name.effective.0.yaml")
  fi
done

# The exit code the podFailurePolicy's FailJob rule relies on: a bad agent.yaml gives 64.
if [ -n "${rendered[cpu-gloo]:-}" ]; then
  "$PY" - "${rendered[cpu-gloo]}" "$T/bad.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "ConfigMap":
        for k in d["data"]:
            d["data"][k] += "\nno_such_setting: 1\n"
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOF
  script="$(pod_script bad "$T/bad.yaml" 0)"
  timeout 60 unshare --mount --propagation private bash "$script" >"$T/bad.out" 2>&1
  rc=$?
  if [ "$rc" -eq 64 ] && grep -q no_such_setting "$T/bad.out"; then
    pass "an unknown key in agent.yaml: the pod exits 64 naming it (the podFailurePolicy FailJob code)"
  else
    fail "a bad agent.yaml: the pod exited $rc, not 64: $(tail -5 "$T/bad.out")"
  fi
fi

# 3. Schemas and rules.
if NODE_MODULES="$(bash "$NPM_DEPS" "$(dirname "$VALIDATE")")"; then
  export NODE_PATH="$NODE_MODULES"
  if node "$VALIDATE" "${vargs[@]}" >"$T/validate.out" 2>&1; then
    pass "schemas, unknown fields and rules: $(grep -c '^ok:' "$T/validate.out") kustomizations"
  else
    fail "validate.js:"
  fi
  cat "$T/validate.out"
  if node "$VALIDATE" --self-test "${vargs[@]}" >"$T/selftest.out" 2>&1; then
    pass "validate.js self-test: $(tail -1 "$T/selftest.out"), each one caught"
  else
    fail "validate.js self-test:"
    grep -v '^ok:' "$T/selftest.out"
  fi
else
  fail "the npm packages of tests/k8s/package-lock.json could not be installed (see above)"
fi
finish
