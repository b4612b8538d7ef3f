#!/usr/bin/env bash
# containers_test.sh: one scenario of containers_test.py, the rendered Kubernetes overlays run as real
# podman containers of the built image (tdist:0.1.0, or $TDIST_TEST_IMAGE; never built here).
#   args: SCENARIO CONTAINERS_TEST_PY K8S_BASE_KUSTOMIZATION [DDP_TRAIN_PY [NO_LIBUV_PY]]
set -euo pipefail

main() {
  local scenario="$1" py k8s
  py="$(realpath "$2")"
  k8s="$(dirname "$(dirname "$(realpath "$3")")")"
  command -v podman >/dev/null || {
    echo "FAIL: podman not found: install podman netavark aardvark-dns iptables runc (docs/testing.md)"
    exit 1
  }
  shift 3
  exec /usr/bin/python3 "$py" "$scenario" "$k8s" "$@"
}

main "$@"
