#!/usr/bin/env bash
# npm_deps.sh DIR: installs the npm packages of DIR/package.json at the exact versions of
# DIR/package-lock.json (`npm ci`) into a cache outside the repository and prints the path of
# their node_modules. Used by tests/k8s/render_test.sh and by .ci/setup (so CI installs them
# before any test runs).
#
# The cache is keyed by the hash of package.json + package-lock.json: a changed lock installs
# afresh, an unchanged one needs no network at all. Location: $TDIST_NPM_CACHE, default
# /var/tmp/tdist-npm (outside the repository, so Bazel never sees node_modules, and outside /tmp,
# which the pod simulation mounts over). npm's own download cache lives there too, so a reinstall
# of a known lock works offline. Concurrent callers (tests in parallel, asan and normal runs) are
# serialised by flock; an install is built in a temporary directory and renamed into place, so a
# killed install never leaves a half-filled node_modules that looks complete.
# Exit status: 0 and the path on stdout, else 1 with npm's messages on stderr.
set -euo pipefail

src="$(cd "$1" && pwd)"
for f in package.json package-lock.json; do
  [ -f "$src/$f" ] || { echo "npm_deps: $src/$f is missing" >&2; exit 1; }
done
command -v npm >/dev/null || {
  echo "npm_deps: npm is not installed (.ci/setup installs Debian's nodejs and npm when node is missing)" >&2
  exit 1
}

cache="${TDIST_NPM_CACHE:-/var/tmp/tdist-npm}"
key="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)"
dest="$cache/k8s-$key"
if [ -f "$dest/.complete" ]; then
  echo "$dest/node_modules"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 600 9 || { echo "npm_deps: waited 600 s for $cache/.lock" >&2; exit 1; }
if [ ! -f "$dest/.complete" ]; then
  # Under `bazel test` HOME is the test's temporary directory: take npm's user configuration
  # (registry, proxy) from the real home of this user, as a shell would.
  if [ ! -f "${HOME:-/nonexistent}/.npmrc" ] && [ -z "${npm_config_userconfig:-}" ]; then
    home="$(getent passwd "$(id -u)" | cut -d: -f6)"
    if [ -n "$home" ] && [ -f "$home/.npmrc" ]; then export npm_config_userconfig="$home/.npmrc"; fi
  fi
  tmp="$(mktemp -d "$cache/.install.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  cp "$src/package.json" "$src/package-lock.json" "$tmp/"
  echo "npm_deps: npm ci in $tmp (for $dest)" >&2
  if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline --loglevel=error \
    --cache "$cache/.npm-cache" >&2); then
    echo "npm_deps: npm ci failed for $src/package-lock.json (is the npm registry reachable?)" >&2
    exit 1
  fi
  touch "$tmp/.complete"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  trap - EXIT
  # Older installs of other locks are dead weight.
  find "$cache" -mindepth 1 -maxdepth 1 -name 'k8s-*' ! -name "k8s-$key" -exec rm -rf {} +
fi
echo "$dest/node_modules"
