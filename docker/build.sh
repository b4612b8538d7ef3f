#!/usr/bin/env bash
# Builds tdist's container images from docker/Dockerfile with the machine's container engine
# (podman, or docker where that is what the machine has; --engine picks one), from the repository
# root as the build context:
#
#   bash docker/build.sh                 tdist:0.1.0       the cpu target (the default)
#   bash docker/build.sh --target gpu    tdist-gpu:0.1.0   the gpu target, where its base image
#                                                          (CUDA_RUNTIME_IMAGE) is in the engine
#   bash docker/build.sh --torch         tdist:0.1.0, then tdist-torch113:0.1.0 and
#                                        tdist-torch26:0.1.0: docs/pytorch.md's recipe
#                                        (docker/torch/Dockerfile) on Debian's PyTorch 1.13 and 2.6
#                                        (bases from docker/base_images.sh --torch)
#
# The version (tag, label) is include/tdist/version.h's, the revision label `git rev-parse HEAD`.
# Build args: --build-arg NAME=VALUE is passed on. Where no registry is reachable (our machines),
# docker/base_images.sh makes the base images first; the cuda-headers stage then reads
# localhost/tdist-cuda-headers:13 (CUDA_DEVEL_IMAGE) when the engine has it and no CUDA_DEVEL_IMAGE
# is given. Images already built are rebuilt from the engine's layer cache (seconds when nothing
# changed). docker/check_image.sh checks what this built.
# Usage: docker/build.sh [--engine podman|docker] [--target cpu|gpu] [--torch] [--build-arg A=V]...
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine=""
target=cpu
torch=0
args=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "build.sh: $*" >&2; exit 1; }

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --engine) engine="${2:?--engine needs podman or docker}"; shift ;;
      --target) target="${2:?--target needs cpu or gpu}"; shift ;;
      --torch) torch=1 ;;
      --build-arg) args+=("${2:?--build-arg needs NAME=VALUE}"); shift ;;
      -h | --help) usage; exit 0 ;;
      *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
  done
  case "$target" in cpu | gpu) ;; *) die "--target '$target': the Dockerfile's targets are cpu and gpu" ;; esac
  if [ "$torch" = 1 ] && [ "$target" != cpu ]; then die "--torch builds on the cpu image: drop --target $target"; fi
}

# pick_engine: --engine's, else podman, else docker with a running daemon.
pick_engine() {
  if [ -n "$engine" ]; then
    command -v "$engine" >/dev/null || die "--engine $engine: not installed"
    return
  fi
  if command -v podman >/dev/null; then engine=podman
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  else die "no container engine: install podman (docs/operators.md, 'Container images'), or start docker's daemon"; fi
}

have_image() { "$engine" image inspect "$1" >/dev/null 2>&1; }

# arg_value NAME DEFAULT: the value of --build-arg NAME=..., else DEFAULT.
arg_value() {
  local a v="$2"
  for a in ${args[@]+"${args[@]}"}; do [ "${a%%=*}" != "$1" ] || v="${a#*=}"; done
  echo "$v"
}

# dockerfile_default NAME: the default of `ARG NAME=...` in docker/Dockerfile.
dockerfile_default() { sed -n "s/^ARG $1=//p" "$root/docker/Dockerfile" | head -1; }

# build TAG FILE CONTEXT ARGS...: one engine build, its output prefixed; the time it took.
build() {
  local tag="$1" file="$2" ctx="$3" t0=$SECONDS old new
  shift 3
  old="$("$engine" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
  echo "build.sh: $engine build -t $tag -f ${file#"$root"/} $* ${ctx#"$root"/}"
  "$engine" build -t "$tag" -f "$file" "$@" "$ctx" 2>&1 | tee -a "$buildlog" | sed -u 's/^/  | /'
  [ "${PIPESTATUS[0]}" = 0 ] || die "building $tag failed (the engine's output is above)"
  echo "build.sh: $tag built in $((SECONDS - t0)) s"
  # The image the tag named before, if this build replaced it (a machine that rebuilds on every
  # change would otherwise keep each one); one still in use by a container stays.
  new="$("$engine" image inspect --format '{{.Id}}' "$tag")"
  if [ -n "$old" ] && [ "$old" != "$new" ]; then "$engine" rmi "$old" >/dev/null 2>&1 || true; fi
}

# prune_build_stage: removes the build stage's images of earlier builds (their working directory
# is the stage's /build/src: a checkout and its Bazel output root, about 1.5 GB each), which
# every change of the sources would otherwise leave behind untagged. The images this build made
# or took from the cache (the "--> ID" and "--> Using cache ID" lines of its output) stay, so an
# unchanged tree rebuilds in seconds, and so does the apt-get layer (no working directory yet).
# Only untagged images; removal goes child first, so it takes a few passes; an image another one
# still uses stays.
prune_build_stage() {
  local keep id k used removed pass
  keep="$(sed -nE 's/^--> (Using cache )?([0-9a-f]{11,64})$/\2/p' "$buildlog" | sort -u)"
  [ -n "$keep" ] || return 0
  for pass in 1 2 3 4 5 6; do
    removed=0
    for id in $("$engine" images -a -q --no-trunc --filter dangling=true); do
      id="${id#sha256:}" used=0
      [ "$("$engine" image inspect --format '{{.Config.WorkingDir}}' "$id" 2>/dev/null)" = /build/src ] || continue
      for k in $keep; do [[ "$id" != "$k"* ]] || used=1; done
      [ "$used" = 0 ] || continue
      if "$engine" rmi "$id" >/dev/null 2>&1; then removed=$((removed + 1)); fi
    done
    [ "$removed" -gt 0 ] || break
    echo "build.sh: removed $removed image(s) of earlier builds' build stage (pass $pass)"
  done
}

buildlog=""
cleanup() { if [ -n "$buildlog" ]; then rm -f "$buildlog"; fi; }
trap cleanup EXIT

main() {
  parse_args "$@"
  buildlog="$(mktemp /tmp/tdist-build.XXXXXX)"
  pick_engine
  local version rev name cuda_devel cuda_runtime
  version="$(sed -n 's/^#define TDIST_VERSION_STRING "\(.*\)"/\1/p' "$root/include/tdist/version.h")"
  [ -n "$version" ] || die "no TDIST_VERSION_STRING in include/tdist/version.h"
  rev="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  cuda_devel="$(arg_value CUDA_DEVEL_IMAGE "")"
  if [ -z "$cuda_devel" ] && have_image localhost/tdist-cuda-headers:13; then
    args+=("CUDA_DEVEL_IMAGE=localhost/tdist-cuda-headers:13")
  fi
  name=tdist
  if [ "$target" = gpu ]; then
    name=tdist-gpu
    cuda_runtime="$(arg_value CUDA_RUNTIME_IMAGE "$(dockerfile_default CUDA_RUNTIME_IMAGE)")"
    have_image "$cuda_runtime" ||
      die "--target gpu needs its base image $cuda_runtime, which $engine does not have: pull or load it first ($engine pull $cuda_runtime), or name a CUDA 13 runtime image that $engine has with --build-arg CUDA_RUNTIME_IMAGE=IMAGE"
  fi
  local a bargs=(--build-arg "IMAGE_VERSION=$version" --build-arg "VCS_REF=$rev")
  for a in ${args[@]+"${args[@]}"}; do bargs+=(--build-arg "$a"); done
  build "$name:$version" "$root/docker/Dockerfile" "$root" --target "$target" "${bargs[@]}"
  prune_build_stage
  [ "$torch" = 1 ] || return 0

  bash "$root/docker/base_images.sh" --engine "$engine" --torch
  build "tdist-torch113:$version" "$root/docker/torch/Dockerfile" "$root/docker/torch" \
    --build-arg "TDIST_IMAGE=tdist:$version" --build-arg "PYTORCH_IMAGE=localhost/debian-pytorch:1.13"
  build "tdist-torch26:$version" "$root/docker/torch/Dockerfile" "$root/docker/torch" \
    --build-arg "TDIST_IMAGE=tdist:$version" --build-arg "PYTORCH_IMAGE=localhost/debian-pytorch:2.6" \
    --build-arg "TDIST_PACKAGES=libmicrohttpd12t64 libyaml-0-2 libpmix2t64 libcurl4t64"
}

main "$@"
