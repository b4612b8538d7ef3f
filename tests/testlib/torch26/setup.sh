#!/usr/bin/env bash
# Builds (or checks) the PyTorch 2.6 root that the tests run 2.6 processes in: a Debian 13 (trixie)
# minbase root made by debootstrap from Debian's archive, with python3-torch 2.6 and numpy, and
# what building tdist_torch's C++ group needs (libtorch-dev, pybind11-dev, g++).
#
#   bash tests/testlib/torch26/setup.sh [DIR]     (DIR default: $TDIST_TORCH26_ROOT or
#                                                  /var/tmp/tdist-trixie)
#
# Idempotent: a root that already imports torch 2.6 is only checked (no network). A half-built
# root (an interrupted run) is removed and built again. Needs root and debootstrap (.ci/setup
# installs it). About two and a half minutes on these machines.
#
# Inside the root it installs no_libuv.py (beside this file) with a .pth file that imports it at
# every interpreter start (Debian's own sitecustomize.py stays): Debian's 2.6 is built without
# libuv, while TCPStore(...) and PyTorch's own rendezvous code ask for libuv by default; the hook
# makes use_libuv default to False. It changes only which server implementation a 2.6 process
# starts (the TCPStore client is the same code either way).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${1:-${TDIST_TORCH26_ROOT:-/var/tmp/tdist-trixie}}"
mirror="${TDIST_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
stamp="$root/.tdist-torch26-ready"

check() {
  "$here/python3" -c 'import torch, numpy, torch.distributed as d
assert torch.__version__.startswith("2.6"), torch.__version__
s = d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
s.set("k", "v"); assert s.get("k") == b"v"
print("torch26: PyTorch", torch.__version__, "ready in", __import__("sys").prefix)'
}

install_hook() {
  local dir="$root/usr/lib/python3/dist-packages"
  cmp -s "$here/no_libuv.py" "$dir/tdist_no_libuv.py" || cp "$here/no_libuv.py" "$dir/tdist_no_libuv.py"
  [ "$(cat "$dir/tdist_no_libuv.pth" 2>/dev/null)" = "import tdist_no_libuv" ] ||
    echo "import tdist_no_libuv" >"$dir/tdist_no_libuv.pth"
  # Mount points python3 binds the host's directories on (it cannot make them on a read-only /).
  local d
  for d in /work /srv /mnt /opt /home /root; do [ -d "$root$d" ] || mkdir -p "$root$d"; done
  # ... and the one holding this checkout, wherever CI clones it (/builds, /ci, ...).
  local top
  top="/$(realpath "$here" | cut -d/ -f2)"
  case "$top" in
    /bin | /boot | /dev | /etc | /lib* | /proc | /run | /sbin | /sys | /usr | /var) ;;
    *) [ -d "$root$top" ] || mkdir -p "$root$top" ;;
  esac
}

# What building tdist_torch's C++ group for 2.6 needs in the root (//runtime/torch:tdist_c_torch26):
# PyTorch's C++ headers, pybind11's (Debian's libtorch-dev does not bring them) and g++. Added to
# a root built before they were needed, too (apt, about 20 s). python3-setuptools: PyTorch's test
# helpers (torch.testing._internal, which tests/torch/suite runs) import torch.utils.cpp_extension,
# which needs it, and Debian's python3-torch does not pull it in.
dev_pkgs="libtorch-dev pybind11-dev g++ python3-setuptools"
has_dev() {
  [ -f "$root/usr/include/torch/csrc/distributed/c10d/ProcessGroup.hpp" ] &&
    [ -f "$root/usr/include/pybind11/pybind11.h" ] && [ -x "$root/usr/bin/g++" ] &&
    [ -f "$root/usr/lib/python3/dist-packages/setuptools/command/build_ext.py" ]
}
install_dev() {
  has_dev && return 0
  [ "$(id -u)" -eq 0 ] || { echo "torch26: need root to install $dev_pkgs in $root" >&2; exit 1; }
  echo "torch26: installing $dev_pkgs in $root"
  unshare --mount --propagation private -- sh -c '
    set -e
    mount -t proc proc "$1/proc"
    mount --rbind /dev "$1/dev"
    cp /etc/resolv.conf "$1/etc/resolv.conf" 2>/dev/null || true
    chroot "$1" apt-get update -q || true
    DEBIAN_FRONTEND=noninteractive chroot "$1" apt-get install -y -q --no-install-recommends $2
    chroot "$1" apt-get clean
  ' sh "$root" "$dev_pkgs" >"$root.apt-dev.log" 2>&1 || {
    tail -20 "$root.apt-dev.log" >&2
    echo "torch26: installing $dev_pkgs in $root failed (log: $root.apt-dev.log)" >&2
    exit 1
  }
  rm -f "$root.apt-dev.log"
}

if [ -f "$stamp" ]; then
  install_hook
  install_dev
  TDIST_TORCH26_ROOT="$root" check && exit 0
  echo "torch26: $root is marked ready but does not work: building it again" >&2
fi
[ "$(id -u)" -eq 0 ] || { echo "torch26: need root to build $root" >&2; exit 1; }
command -v debootstrap >/dev/null || {
  echo "torch26: debootstrap is missing: apt-get install debootstrap (or run .ci/setup)" >&2
  exit 1
}
if [ -e "$root" ]; then
  echo "torch26: removing the incomplete root $root"
  # Never follow a mount left inside by an interrupted run (the host's /proc, /tmp ...).
  if findmnt -rn -o TARGET | grep -q "^$root/"; then
    echo "torch26: $root has mounts under it; unmount them first:" >&2
    findmnt -rn -o TARGET | grep "^$root/" >&2
    exit 1
  fi
  rm -rf --one-file-system "$root"
fi
mkdir -p "$(dirname "$root")"
echo "torch26: debootstrap --variant=minbase trixie $root (Debian's archive)"
t0=$(date +%s)
debootstrap --variant=minbase trixie "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
  tail -20 "$root.debootstrap.log" >&2
  echo "torch26: debootstrap failed (log: $root.debootstrap.log)" >&2
  exit 1
}
# apt inside the root needs /proc and /dev only for a few maintainer scripts; a private mount
# namespace keeps those mounts away from the host and drops them when apt exits.
unshare --mount --propagation private -- sh -c '
  set -e
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  cp /etc/resolv.conf "$1/etc/resolv.conf" 2>/dev/null || true
  DEBIAN_FRONTEND=noninteractive chroot "$1" apt-get install -y -q --no-install-recommends \
    python3-torch python3-numpy procps
  chroot "$1" apt-get clean
' sh "$root" >"$root.apt.log" 2>&1 || {
  tail -20 "$root.apt.log" >&2
  echo "torch26: installing python3-torch in $root failed (log: $root.apt.log)" >&2
  exit 1
}
install_dev
install_hook
TDIST_TORCH26_ROOT="$root" check
touch "$stamp"
rm -f "$root.debootstrap.log" "$root.apt.log"
echo "torch26: built $root in $(($(date +%s) - t0)) s"
