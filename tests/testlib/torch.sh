# Sourced by shell tests that run PyTorch: picks the interpreter for the version in TDIST_TORCH
# (set per test by torch_sh_test in torch.bzl; default 1.13) and checks that it imports torch of
# that version, so a test can never pass against the wrong PyTorch.
#   1.13  Debian 12's python3-torch in /usr/bin/python3 (the python3 first on PATH has no torch)
#   2.6   Debian 13's python3-torch in the root of tests/testlib/torch26/setup.sh, entered by
#         tests/testlib/torch26/python3 (same arguments, environment, cwd and PID)
# Sets PY (absolute path of the interpreter), TDIST_TORCH_EXT and TDIST_TORCH_IMPL=cpp where the
# test has tdist_torch's C++ group for this version (see below), TORCH_VERSION (torch.__version__), TORCH_TAG
# (torch113 / torch26: for file names and messages) and TORCH_MAJOR_MINOR ("1.13" / "2.6").
# On any problem it prints why and what to run, and exits 1: a missing 2.6 root fails the test.

_torch_lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCH_MAJOR_MINOR="${TDIST_TORCH:-1.13}"
case "$TORCH_MAJOR_MINOR" in
  1.13) PY=/usr/bin/python3; TORCH_TAG=torch113 ;;
  2.6) PY="$_torch_lib/torch26/python3"; TORCH_TAG=torch26 ;;
  *) echo "FAIL: TDIST_TORCH='$TORCH_MAJOR_MINOR': supported versions are 1.13 and 2.6" >&2; exit 1 ;;
esac
if ! TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)' 2>&1)"; then
  echo "FAIL: PyTorch $TORCH_MAJOR_MINOR is not usable through $PY:" >&2
  echo "$TORCH_VERSION" | tail -n 5 >&2
  echo "  (run .ci/setup: it installs python3-torch 1.13 and builds the 2.6 root)" >&2
  exit 1
fi
TORCH_VERSION="$(echo "$TORCH_VERSION" | tail -n 1)"
case "$TORCH_VERSION" in
  "$TORCH_MAJOR_MINOR".* | "$TORCH_MAJOR_MINOR"a* | "$TORCH_MAJOR_MINOR"+*) ;;
  # Debian 12's 1.13.1 reports itself as 1.13.0a0.
  *) echo "FAIL: $PY runs PyTorch $TORCH_VERSION, not $TORCH_MAJOR_MINOR" >&2; exit 1 ;;
esac
export TDIST_PYTHON="$PY"
# tdist_torch's C++ group for this PyTorch, where the test has it (torch_sh_test(torch_ext =
# True)): tdist_torch loads it and, unless the test chose otherwise, fails without it.
if [ -f "$_torch_lib/../../runtime/torch/tdist_c_$TORCH_TAG.so" ]; then
  export TDIST_TORCH_EXT="$(realpath "$_torch_lib/../../runtime/torch/tdist_c_$TORCH_TAG.so")"
  export TDIST_TORCH_IMPL="${TDIST_TORCH_IMPL:-cpp}"
fi
echo "torch.sh: PyTorch $TORCH_VERSION via $PY" >&2
. "$_torch_lib/ports.sh"   # free_port
