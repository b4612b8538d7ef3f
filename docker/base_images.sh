#!/usr/bin/env bash
# Makes, in the local container engine (podman, or docker where that is what the machine has), the
# base images that docker/Dockerfile's FROM lines name, for machines that reach Debian's archive but
# no image registry (ours; see ../shared/ENVIRONMENT.md). Where a registry is reachable nothing here
# is needed: the same FROM lines pull the real images.
#
#   debian:bookworm        debootstrap --variant=minbase bookworm (apt works in it: the build stage
#                          installs its packages with apt-get, as on the real image)
#   debian:bookworm-slim   the same root less documentation, man pages and locales, as Debian's
#                          slim images are made
#   localhost/tdist-cuda-headers:13
#                          what the Dockerfile's cuda-headers stage reads from NVIDIA's devel image:
#                          this machine's CUDA 13 headers (/usr/local/cuda/include, with nccl.h) in
#                          /usr/local/cuda/include, on debian:bookworm. docker/build.sh passes it as
#                          --build-arg CUDA_DEVEL_IMAGE. Only headers: nothing of it reaches the
#                          final images, as with NVIDIA's image.
#
# An image already present is kept (delete it with `podman rmi NAME` to make it anew). Each
# debootstrap takes about a minute, from Debian's archive (DEBIAN_MIRROR, default deb.debian.org).
# Usage: docker/base_images.sh [--engine podman|docker] [--cuda DIR]   (needs root)
set -euo pipefail

mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cuda="/usr/local/cuda"
engine=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:?--engine needs podman or docker}"; shift ;;
    --cuda) cuda="${2:?--cuda needs a directory}"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "base_images.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# pick_engine: podman if present, else docker (with a running daemon).
pick_engine() {
  if [ -n "$engine" ]; then return; fi
  if command -v podman >/dev/null; then engine=podman
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  else
    echo "base_images.sh: no container engine: install podman (see README, 'The image')" >&2
    exit 1
  fi
}

have_image() { "$engine" image inspect "$1" >/dev/null 2>&1; }

work=""
cleanup() { if [ -n "$work" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

# debian_root DIR: a minbase bookworm root in DIR.
debian_root() {
  command -v debootstrap >/dev/null || {
    echo "base_images.sh: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
  }
  echo "base_images.sh: debootstrap bookworm (minbase) from $mirror"
  debootstrap --variant=minbase bookworm "$1" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    echo "base_images.sh: debootstrap failed (log above)" >&2
    exit 1
  }
  rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*
}

# import DIR NAME: the root DIR as image NAME, with the defaults of Debian's images.
import() {
  echo "base_images.sh: importing $2"
  tar -C "$1" --numeric-owner -c . |
    "$engine" import --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$2" >/dev/null
}

main() {
  pick_engine
  work="$(mktemp -d /var/tmp/tdist-base.XXXXXX)"
  if ! have_image debian:bookworm || ! have_image debian:bookworm-slim; then
    debian_root "$work/root"
    have_image debian:bookworm || import "$work/root" debian:bookworm
    if ! have_image debian:bookworm-slim; then
      rm -rf "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/* "$work/root"/usr/share/info/*
      find "$work/root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
      import "$work/root" debian:bookworm-slim
    fi
  fi
  if ! have_image localhost/tdist-cuda-headers:13; then
    for h in cuda_runtime_api.h nccl.h; do
      [ -f "$cuda/include/$h" ] || {
        echo "base_images.sh: no $cuda/include/$h: the cuda-headers stage needs CUDA 13 and NCCL headers (--cuda DIR)" >&2
        exit 1
      }
    done
    mkdir -p "$work/cuda"
    cp -a "$cuda/include/." "$work/cuda/include/"
    printf 'FROM debian:bookworm\nCOPY include/ /usr/local/cuda/include/\n' >"$work/cuda/Containerfile"
    echo "base_images.sh: building localhost/tdist-cuda-headers:13 from $cuda/include"
    local pull=()
    [ "$engine" != podman ] || pull=(--pull=never)
    "$engine" build "${pull[@]}" -q -t localhost/tdist-cuda-headers:13 -f "$work/cuda/Containerfile" "$work/cuda" >/dev/null
  fi
  echo "base_images.sh: $engine has debian:bookworm, debian:bookworm-slim, localhost/tdist-cuda-headers:13"
}

main
