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
# With --torch, also the two PyTorch images a user's training image would start FROM (the
# recipe of docs/pytorch.md, docker/torch/Dockerfile), made from Debian's archive only, nothing of
# ours in them:
#   localhost/debian-pytorch:1.13   debian:bookworm + python3-torch 1.13, python3-numpy and what
#                                   building tdist_torch's C++ group needs (libtorch-dev,
#                                   pybind11-dev, g++), installed by apt-get in a container
#   localhost/debian-pytorch:2.6    Debian 13 (trixie) + python3-torch 2.6, python3-numpy,
#                                   libtorch-dev, pybind11-dev, g++, python3-setuptools: the root of
#                                   tests/testlib/torch26/setup.sh (TDIST_TORCH26_ROOT, default
#                                   /var/tmp/tdist-trixie) imported less the files of ours in it
#                                   (its no_libuv hook, its stamp), else a fresh debootstrap
#
# An image already present is kept (delete it with `podman rmi NAME` to make it anew). Each
# debootstrap takes about a minute, from Debian's archive (DEBIAN_MIRROR, default deb.debian.org);
# the 1.13 image about 3 minutes (apt-get in a container), the 2.6 import about 1.
# Usage: docker/base_images.sh [--engine podman|docker] [--cuda DIR] [--torch]   (needs root)
set -euo pipefail

mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cuda="/usr/local/cuda"
engine=""
torch=0
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:?--engine needs podman or docker}"; shift ;;
    --cuda) cuda="${2:?--cuda needs a directory}"; shift ;;
    --torch) torch=1 ;;
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
    echo "base_images.sh: no container engine: install podman (see docs/operators.md, 'Container images')" >&2
    exit 1
  fi
}

have_image() { "$engine" image inspect "$1" >/dev/null 2>&1; }

work=""
cleanup() { if [ -n "$work" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

# debian_root DIR [SUITE]: a minbase root of SUITE (default bookworm) in DIR.
debian_root() {
  local suite="${2:-bookworm}"
  command -v debootstrap >/dev/null || {
    echo "base_images.sh: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
  }
  echo "base_images.sh: debootstrap $suite (minbase) from $mirror"
  debootstrap --variant=minbase "$suite" "$1" "$mirror" >"$work/debootstrap.log" 2>&1 || {
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

# build_from DIR NAME: builds DIR/Containerfile as NAME from local base images only.
build_from() {
  local pull=()
  [ "$engine" != podman ] || pull=(--pull=never)
  "$engine" build "${pull[@]}" -t "$2" -f "$1/Containerfile" "$1" >"$work/build.log" 2>&1 || {
    tail -20 "$work/build.log" >&2
    echo "base_images.sh: building $2 failed (log above)" >&2
    exit 1
  }
}

# torch113: localhost/debian-pytorch:1.13, Debian 12's python3-torch installed by apt-get in
# debian:bookworm, as a user's Dockerfile would.
torch113() {
  have_image localhost/debian-pytorch:1.13 && return
  echo "base_images.sh: building localhost/debian-pytorch:1.13 (apt-get install python3-torch in debian:bookworm)"
  mkdir -p "$work/torch113"
  cat >"$work/torch113/Containerfile" <<'EOF'
FROM debian:bookworm
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3-torch python3-numpy libtorch-dev pybind11-dev g++ \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -c 'import torch; assert torch.__version__.startswith("1.13"), torch.__version__'
CMD ["python3"]
EOF
  build_from "$work/torch113" localhost/debian-pytorch:1.13
}

# torch26: localhost/debian-pytorch:2.6 from the PyTorch 2.6 root when it is ready (its packages
# are the ones a user's image needs; tar leaves out our hook, the root's stamp and whatever is
# mounted in it), else debootstrap trixie + the same packages.
torch26() {
  have_image localhost/debian-pytorch:2.6 && return
  local t26="${TDIST_TORCH26_ROOT:-/var/tmp/tdist-trixie}" dir
  if [ -f "$t26/.tdist-torch26-ready" ]; then
    dir="$t26"
  else
    dir="$work/trixie"
    debian_root "$dir" trixie
    chroot "$dir" apt-get update -q >"$work/apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive chroot "$dir" apt-get install -y -q --no-install-recommends \
      python3-torch python3-numpy libtorch-dev pybind11-dev g++ python3-setuptools procps \
      >>"$work/apt.log" 2>&1 </dev/null || {
      tail -20 "$work/apt.log" >&2
      echo "base_images.sh: apt-get install python3-torch in trixie failed (log above)" >&2
      exit 1
    }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  fi
  echo "base_images.sh: importing localhost/debian-pytorch:2.6 from $dir"
  tar -C "$dir" --numeric-owner --one-file-system \
    --exclude=./.tdist-torch26-ready --exclude='./usr/lib/python3/dist-packages/tdist_no_libuv.*' \
    --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' --exclude='./tmp/*' \
    --exclude='./run/*' --exclude=./work --exclude='./var/cache/apt/archives/*.deb' -c . |
    "$engine" import --change 'CMD ["python3"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - \
      localhost/debian-pytorch:2.6 >/dev/null
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
  local torch_names=""
  if [ "$torch" = 1 ]; then
    torch113
    torch26
    torch_names=", localhost/debian-pytorch:1.13 and :2.6"
  fi
  echo "base_images.sh: $engine has debian:bookworm, debian:bookworm-slim, localhost/tdist-cuda-headers:13$torch_names"
}

main
