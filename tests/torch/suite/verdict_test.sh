#!/usr/bin/env bash
# verdict_test.py: run_suite's verdict rules, and that expected_failures.txt and world3.txt parse.
#   args: VERDICT_TEST_PY EXPECTED_FAILURES_TXT WORLD3_TXT
set -euo pipefail
PYTHONDONTWRITEBYTECODE=1 exec python3 "$(realpath "$1")" "$(realpath "$2")" "$(realpath "$3")"
