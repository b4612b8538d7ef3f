#!/usr/bin/env bash
# orchestrators_containers_test.sh: the pods of one controller (trainer, jobset, volcano) as
# orchestrators_containers_test.py runs them: real podman containers of the built image.
#   args: CONTROLLER ORCHESTRATORS_CONTAINERS_TEST_PY K8S_BASE_KUSTOMIZATION
set -euo pipefail

main() {
  local py k8s
  py="$(realpath "$2")"
  k8s="$(dirname "$(dirname "$(realpath "$3")")")"
  command -v podman >/dev/null || {
    echo "FAIL: podman not found: install podman netavark aardvark-dns iptables runc (README)"
    exit 1
  }
  exec /usr/bin/python3 "$py" "$1" "$k8s"
}

main "$@"
