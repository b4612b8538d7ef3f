#!/usr/bin/env bash
# Runs docker/check_build.sh --prebuilt from the runfiles tree (the test's working directory),
# which holds the files the Dockerfile reads and the outputs its `bazel build` step would make.
#   args: the bazel-bin paths of those outputs (their rootpaths)
set -euo pipefail
exec bash docker/check_build.sh --prebuilt "$@"
