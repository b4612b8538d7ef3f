#!/usr/bin/env bash
# k8s/monitoring as users apply it (`kubectl kustomize`, as `kubectl apply -k` renders it):
#   1. the PrometheusRule validates against prometheus-operator's CRD (tests/k8s/crds, v0.93.0;
#      unknown fields rejected, crd_validate.js with its self-test's mutations caught) and the
#      dashboard ConfigMap against the Kubernetes schema (validate.js's checkSchema);
#   2. the dashboard: the sidecar's label grafana_dashboard: "1", JSON that parses, every panel
#      has a query on the $datasource variable, every $variable in a query is the dashboard's;
#   3. `promtool check rules` on the rule groups;
#   4. `promtool test rules` on every case of monitoring_cases.yaml, built on the series recorded
#      from a real job (monitoring_series.txt, made by monitoring_live_test.sh --record): every
#      alert fires in at least one case and stays quiet in another; the self-test rewrites each
#      alert to never fire, then to always fire, and each rewrite must fail its cases.
# Series the rules read that the recording lacks (issue 37's series other branches add) are
# listed: their cases use series written by hand until the recording is regenerated.
#   args: MONITORING_PY CRD_VALIDATE_JS NPM_DEPS_SH CRD_DIR SERIES CASES K8S_BASE_KUSTOMIZATION
set -euo pipefail

PY=/usr/bin/python3
fails=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# check NAME CMD...: runs CMD, its output kept in $T/NAME.out; PASS with its last line or FAIL
# with all of it.
check() {
  local name="$1"
  shift
  if "$@" >"$T/$name.out" 2>&1; then
    pass "$name: $(grep -v "^ *$" "$T/$name.out" | tail -1)"
  else
    fail "$name:"
    cat "$T/$name.out"
  fi
}

main() {
  local mon crdv npm crds series cases k8s nm
  mon="$(realpath "$1")" crdv="$(realpath "$2")" npm="$(realpath "$3")" crds="$(realpath "$4")"
  series="$(realpath "$5")" cases="$(realpath "$6")"
  k8s="$(dirname "$(dirname "$(realpath "$7")")")"
  local tool
  for tool in "$PY" promtool kubectl node; do
    command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (Debian packages prometheus, nodejs; kubectl)"; exit 1; }
  done
  T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/monrules.XXXXXX")"
  [ -n "${TEST_TMPDIR:-}" ] || trap 'rm -rf "$T"' EXIT
  cp -rL "$k8s/monitoring" "$T/monitoring"
  if kubectl kustomize "$T/monitoring" >"$T/monitoring.yaml" 2>"$T/render.err"; then
    pass "k8s/monitoring renders: $(grep '^kind:' "$T/monitoring.yaml" | sort | tr '\n' ' ')"
  else
    fail "k8s/monitoring: kubectl kustomize: $(cat "$T/render.err")"
    exit 1
  fi

  # 1. Schemas.
  if nm="$(bash "$npm" "$(dirname "$crdv")")"; then
    export NODE_PATH="$nm"
    check crd_validate node "$crdv" --self-test "$crds" "$T/monitoring.yaml"
    grep '^ok: [^s]' "$T/crd_validate.out" || true
    # shellcheck disable=SC2016 # node's template strings
    check configmap_schema node -e '
      const YAML = require(require.resolve("yaml", { paths: [process.env.NODE_PATH] }));
      const { checkSchema } = require(process.argv[1]);
      const docs = YAML.parseAllDocuments(require("fs").readFileSync(process.argv[2], "utf8")).map((d) => d.toJS());
      const cms = docs.filter((o) => o && o.kind === "ConfigMap");
      const errs = cms.flatMap((o) => checkSchema(o));
      errs.forEach((e) => console.log(e));
      console.log(`${cms.length} ConfigMap(s) valid against the Kubernetes schema: ${cms.length === 1 && !errs.length}`);
      process.exitCode = cms.length === 1 && !errs.length ? 0 : 1;' "$(dirname "$crdv")/validate.js" "$T/monitoring.yaml"
  else
    fail "the npm packages of tests/k8s/package-lock.json could not be installed"
  fi

  # 2. The dashboard's shape.
  check dashboard "$PY" "$mon" panels "$T/monitoring.yaml"

  # 3-4. The rules.
  "$PY" "$mon" rules "$T/monitoring.yaml" "$T/rules.yml"
  check promtool_check_rules promtool check rules "$T/rules.yml"
  if "$PY" "$mon" gen "$series" "$cases" "$T/rules.yml" "$T/tests.yml" >"$T/gen.out" 2>&1; then
    cat "$T/gen.out"
    check promtool_test_rules promtool test rules "$T/tests.yml"
    check selftest "$PY" "$mon" selftest "$T/rules.yml" "$T/tests.yml"
  else
    fail "the cases could not be built:"
    cat "$T/gen.out"
  fi
  echo "monitoring_rules_test: $fails failure(s)"
  [ "$fails" -eq 0 ]
}

main "$@"
