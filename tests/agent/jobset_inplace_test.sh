#!/usr/bin/env bash
# jobset_inplace_test.sh: tdist-agent --jobset-in-place-restart against a stand-in Kubernetes API
# server over HTTPS (jobset_apiserver.py, JobSet's controller rule), three real agents on this
# host with a shell worker; the scenarios are in jobset_inplace_test.py.
#   args: AGENT JOBSET_INPLACE_TEST_PY CONTROLLERS_YAML PORTS_SH
set -euo pipefail

main() {
  command -v openssl >/dev/null || {
    echo "FAIL: openssl not found (the test makes its CA and certificate with it)"
    exit 1
  }
  exec /usr/bin/python3 "$(realpath "$2")" "$(realpath "$1")" "$(realpath "$3")" "$(realpath "$4")"
}

main "$@"
