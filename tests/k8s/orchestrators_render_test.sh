#!/usr/bin/env bash
# The manifests for Kubeflow Trainer v2 (k8s/trainer), JobSet (k8s/jobset, and
# k8s/jobset-in-place: with JobSet's in-place restart protocol) and Volcano (k8s/volcano), checked as render_test checks k8s/base and its overlays:
#   1. each renders with `kubectl kustomize`;
#   2. every Trainer, JobSet and Volcano object (and the sample TrainJob) validates against its
#      published CRD's schema, unknown fields rejected, with the core objects they embed checked
#      against the Kubernetes schemas (crd_validate.js); --self-test shows each check catches its
#      mutation; the ClusterTrainingRuntime and the namespaced TrainingRuntime have one spec;
#   3. shaped as each controller makes them (shape.py, from controllers.yaml: the sources' names,
#      labels, annotations and injected env), every pod's `tdist-agent --check-config` in that
#      pod's environment (podspec.py) exits 0 with the node rank, node count, store address and
#      workers per node the controller means; a bad agent.yaml exits 64;
#   4. the shaped objects (the child Job JobSet makes, or the stand-in for Volcano's pods) hold
#      tdist's deployment rules (validate.js: security profile, probes, ports, selectors of the
#      NetworkPolicy and PodMonitor, podFailurePolicy...).
# Needs root (a private mount namespace per pod), kubectl, node + npm (npm_deps.sh), python3-yaml.
#   args: AGENT TRAIN PODSPEC_PY SHAPE_PY VALIDATE_JS CRD_VALIDATE_JS NPM_DEPS_SH CRD_DIR K8S_BASE_KUSTOMIZATION
set -euo pipefail

PY=/usr/bin/python3
fails=0
passes=0
pass() { echo "PASS: $*"; passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# render NAME: kubectl kustomize k8s/NAME into $T/NAME.yaml.
render() {
  if kubectl kustomize "$T/k8s/$1" >"$T/$1.yaml" 2>"$T/$1.err"; then
    pass "k8s/$1 renders ($(grep -c '^kind:' "$T/$1.yaml") objects)"
  else
    fail "k8s/$1: kubectl kustomize: $(cat "$T/$1.err")"
  fi
}

# check_pods NAME SHAPED: --check-config in every pod of SHAPED; effective configs in $T/NAME.eff.I.
check_pods() {
  local name="$1" shaped="$2" i script hostnames completions
  eval "$("$PY" "$PODSPEC" summary "$shaped" | grep -E '^(hostnames|completions)=')"
  read -r -a hosts <<<"$hostnames"
  for ((i = 0; i < completions; i++)); do
    script="$("$PY" "$PODSPEC" pod "$shaped" --index "$i" --namespace default --pod-ip "10.244.$i.10" \
      --root "$ROOT/$name" --image-prefix /opt/tdist --bin "tdist-agent=$AGENT" --bin "train=$TRAIN")"
    # shellcheck disable=SC2016 # $1 and $@ are the inner shell's
    if timeout 60 unshare --mount --uts --propagation private sh -c 'hostname "$1" && shift && exec bash "$@"' \
      pod "${hosts[$i]}" "$script" --check-config >"$T/$name.eff.$i" 2>"$T/$name.err.$i"; then
      pass "$name: pod ${hosts[$i]}: tdist-agent --check-config accepts its environment"
    else
      fail "$name: pod ${hosts[$i]}: tdist-agent --check-config exited $?: $(tail -3 "$T/$name.err.$i")"
    fi
  done
}

# expect NAME INDEX KEY VALUE: the effective configuration of pod INDEX has KEY: VALUE.
expect() {
  local got
  got="$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get(sys.argv[2]))' "$T/$1.eff.$2" "$3" 2>&1)"
  if [ "$got" = "$4" ]; then
    pass "$1: pod $2: $3 = $4"
  else
    fail "$1: pod $2: $3 is '$got', expected '$4' (what the controller injects: controllers.yaml)"
  fi
}

# trainjob_variant OUT ARGS_PY: the sample TrainJob with its trainer section changed by ARGS_PY
# (python, `t` is spec.trainer).
trainjob_variant() {
  "$PY" - "$T/k8s/trainer/example/trainjob.yaml" "$1" "$2" <<'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
t = d["spec"]["trainer"]
exec(sys.argv[3])
yaml.safe_dump(d, open(sys.argv[2], "w"))
EOF
}

main() {
  AGENT="$(realpath "$1")" TRAIN="$(realpath "$2")" PODSPEC="$(realpath "$3")" SHAPE="$(realpath "$4")"
  VALIDATE="$(realpath "$5")" CRDV="$(realpath "$6")" NPM_DEPS="$(realpath "$7")" CRDS="$(realpath "$8")"
  DRIFT="$(dirname "$SHAPE")/drift.py"
  local k8s_src
  k8s_src="$(dirname "$(dirname "$(realpath "$9")")")"
  if [ "$(id -u)" -ne 0 ]; then
    echo "FAIL: orchestrators_render_test needs root (a private mount namespace per pod)"
    exit 1
  fi
  T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/orch.XXXXXX")"
  ROOT="$(mktemp -d /var/tmp/tdist-k8s-orch.XXXXXX)"
  chmod 755 "$ROOT"
  trap 'rm -rf "$ROOT" "$T"' EXIT
  cp -rL "$k8s_src" "$T/k8s"

  # 1. Render.
  for n in trainer jobset jobset-in-place volcano; do render "$n"; done
  cp "$T/k8s/trainer/example/trainjob.yaml" "$T/trainjob.yaml"

  # 2. The CRDs' schemas.
  local nm
  if ! nm="$(bash "$NPM_DEPS" "$(dirname "$VALIDATE")")"; then
    fail "the npm packages of tests/k8s/package-lock.json could not be installed"
    nm=""
  fi
  export NODE_PATH="$nm"
  local docs=("$T/trainer.yaml" "$T/jobset.yaml" "$T/jobset-in-place.yaml" "$T/volcano.yaml" "$T/trainjob.yaml")
  # One run (the schemas take seconds to compile): each object's check, then its mutations.
  if node "$CRDV" --self-test "$CRDS" "${docs[@]}" >"$T/crd.out" 2>&1; then
    pass "CRD schemas, unknown fields, embedded core objects: $(grep -c '^ok: [^ ]*\.yaml' "$T/crd.out") objects valid"
    pass "crd_validate.js self-test: $(tail -1 "$T/crd.out"), each one caught"
  else
    fail "crd_validate.js (objects, then self-test mutations):"
  fi
  grep -v '^ok: self-test' "$T/crd.out" || true
  if "$PY" - "$T/trainer.yaml" <<'EOF'
import sys, yaml
d = {o["kind"]: o["spec"] for o in yaml.safe_load_all(open(sys.argv[1])) if o and o["kind"].endswith("TrainingRuntime")}
sys.exit(0 if len(d) == 2 and d["ClusterTrainingRuntime"] == d["TrainingRuntime"] else 1)
EOF
  then pass "the ClusterTrainingRuntime and the TrainingRuntime tdist-torch have the same spec"
  else fail "the ClusterTrainingRuntime and the TrainingRuntime tdist-torch differ"; fi

  # No drift from k8s/base: pod templates and agent settings but for what each way must change.
  if kubectl kustomize "$T/k8s/base" >"$T/base.yaml" 2>"$T/drift.out" &&
    "$PY" "$DRIFT" "$T/base.yaml" "$T/trainer.yaml" "$T/jobset.yaml" "$T/volcano.yaml" >>"$T/drift.out" 2>&1; then
    pass "no drift: the pod templates and the agent's settings are k8s/base's (but for what each way changes)"
  else
    fail "drift from k8s/base: $(cat "$T/drift.out")"
  fi

  # 3. Each pod as its controller makes it. --check-config is a flag: the sample's args end with
  # the training command after "--", so they are cut there (Trainer replaces args whole).
  trainjob_variant "$T/tj.yaml" 't["args"] = t["args"][:t["args"].index("--")]'
  trainjob_variant "$T/tj-auto.yaml" 't["args"] = t["args"][:t["args"].index("--")]; del t["numProcPerNode"]'
  trainjob_variant "$T/tj-gpu.yaml" 't["args"] = t["args"][:t["args"].index("--")]; del t["numProcPerNode"]; t["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 3}}'
  "$PY" "$SHAPE" trainer "$T/trainer.yaml" "$T/tj.yaml" "$T/s-trainer.yaml"
  "$PY" "$SHAPE" trainer "$T/trainer.yaml" "$T/tj-auto.yaml" "$T/s-trainer-auto.yaml"
  "$PY" "$SHAPE" trainer "$T/trainer.yaml" "$T/tj-gpu.yaml" "$T/s-trainer-gpu.yaml"
  # Warm spares under Trainer: the runtime's ConfigMap says spares: 1, the TrainJob numNodes: 3
  # (PET_NNODES=3 counts the spare: spares_in_nnodes): 2 active nodes, pod 2 the standby.
  trainjob_variant "$T/tj-spare.yaml" 't["args"] = t["args"][:t["args"].index("--")]; t["numNodes"] = 3'
  "$PY" - "$T/trainer.yaml" "$T/trainer-spare.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "ConfigMap":
        for k in d["data"]:
            assert "\nspares: 0\n" in d["data"][k], "agent.yaml has no 'spares: 0' line"
            d["data"][k] = d["data"][k].replace("\nspares: 0\n", "\nspares: 1\n")
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOF
  "$PY" "$SHAPE" trainer "$T/trainer-spare.yaml" "$T/tj-spare.yaml" "$T/s-trainer-spare.yaml"
  "$PY" "$SHAPE" jobset "$T/jobset.yaml" "$T/s-jobset.yaml"
  "$PY" "$SHAPE" jobset "$T/jobset-in-place.yaml" "$T/s-jobset-in-place.yaml"
  "$PY" "$SHAPE" volcano "$T/volcano.yaml" "$T/s-volcano.yaml"
  for n in trainer trainer-auto trainer-gpu trainer-spare jobset jobset-in-place volcano; do
    check_pods "$n" "$T/s-$n.yaml"
  done
  for i in 0 1 2; do
    expect trainer-spare "$i" node_rank "$i"
    expect trainer-spare "$i" nnodes 2
    expect trainer-spare "$i" spares 1
  done
  for i in 0 1; do
    expect trainer "$i" node_rank "$i"
    expect trainer "$i" nnodes 2
    expect trainer "$i" nproc_per_node 2
    expect trainer "$i" master_addr tdist-example-node-0-0.tdist-example
    expect trainer "$i" master_port 29500
    # numProcPerNode unset, no GPU: Trainer passes the CPU count of the container's requests (2).
    expect trainer-auto "$i" nproc_per_node 2
    # numProcPerNode unset, 3 GPUs per node: Trainer passes "auto", the agent counts the pod's
    # GPUs (/dev/nvidia0..2, as the device plugin exposes them), as torchrun's auto does.
    expect trainer-gpu "$i" nproc_per_node 3
    expect volcano "$i" node_rank "$i"
    expect volcano "$i" nnodes 2
    expect volcano "$i" master_addr tdist-train-master-0.tdist-train
    expect volcano "$i" master_port 29500
    # k8s/jobset-in-place: JobSet's in-place restart protocol on, by TDIST_JOBSET_IN_PLACE_RESTART.
    expect jobset-in-place "$i" jobset_in_place_restart True
  done
  # A bad agent.yaml in the Trainer pod: exit 64, which the Job's podFailurePolicy and the
  # JobSet's FailJobSet rule turn into a failed TrainJob without retries.
  "$PY" - "$T/s-trainer.yaml" "$T/s-bad.yaml" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "ConfigMap":
        for k in d["data"]:
            d["data"][k] += "\nno_such_setting: 1\n"
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOF
  local script rc=0
  script="$("$PY" "$PODSPEC" pod "$T/s-bad.yaml" --index 0 --namespace default --pod-ip 10.244.0.10 \
    --root "$ROOT/bad" --image-prefix /opt/tdist --bin "tdist-agent=$AGENT" --bin "train=$TRAIN")"
  timeout 60 unshare --mount --propagation private bash "$script" >"$T/bad.out" 2>&1 || rc=$?
  if [ "$rc" -eq 64 ] && grep -q no_such_setting "$T/bad.out"; then
    pass "Trainer pod with an unknown key in agent.yaml: exit 64 naming it (FailJob, then FailJobSet)"
  else
    fail "Trainer pod with a bad agent.yaml exited $rc, not 64: $(tail -3 "$T/bad.out")"
  fi

  # 4. tdist's rules on what the controllers make (PodShapes is the harness's, not an object).
  local vargs=()
  for n in trainer jobset volcano; do
    "$PY" -c 'import sys, yaml; yaml.safe_dump_all([d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] != "PodShapes"], open(sys.argv[2], "w"))' \
      "$T/s-$n.yaml" "$T/v-$n.yaml"
    vargs+=("$n:cpu" "$T/v-$n.yaml" "$T/$n.eff.0")
  done
  if node "$VALIDATE" "${vargs[@]}" >"$T/validate.out" 2>&1; then
    pass "the controllers' Jobs and pods hold tdist's rules: $(grep -c '^ok:' "$T/validate.out") sets"
  else
    fail "validate.js on the shaped objects:"
  fi
  cat "$T/validate.out"

  echo "orchestrators_render_test: $passes passed, $fails failed"
  [ "$fails" -eq 0 ]
}

main "$@"
