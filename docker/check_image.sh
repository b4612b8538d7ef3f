#!/usr/bin/env bash
# Checks the images docker/build.sh built, in the container engine that holds them (podman, or
# docker; --engine picks one), as root:
#
#  1. tdist:VERSION's settings (`image inspect`): USER 65532:65532, EXPOSE = the containerPorts of
#     k8s/base/job.yaml, STOPSIGNAL SIGTERM, ENTRYPOINT tdist-agent, the OCI labels (version =
#     include/tdist/version.h);
#  2. its files (copied out of a created container): no RPATH/RUNPATH into Bazel's tree, and every
#     DT_NEEDED library of every ELF under /opt/tdist comes, inside the image, from a package the
#     cpu stage's apt-get line installs or from the base image (its label base.name), and every
#     package of that line provides one (none installed for nothing);
#  3. the build context (the build stage, from the layer cache): the Bazel workspace is in,
#     .git and bazel-* are not;
#  4. runs as UID 65532 with `--read-only --cap-drop ALL --tmpfs /tmp`: --version, --check-config
#     of k8s/base/agent.yaml mounted where the Job's ConfigMap goes, a 2-worker job
#     (`--standalone --nproc-per-node 2 -- /opt/tdist/bin/train`: train: OK), the ConfigMap's own
#     job (hostname and env of pod 0), /healthz and /readyz from the host on the container's IP,
#     `stop` (SIGTERM to PID 1: exit 143), a C program built here against the image's
#     /opt/tdist/include and libtdist.so run in the image;
#  5. the gpu stage statically (its base image is not on our machines, so it cannot be built here):
#     the same COPY lines, USER, EXPOSE, STOPSIGNAL and ENTRYPOINT as cpu, the Ubuntu names (t64)
#     of the cpu stage's packages, and its RUN that checks libcudart.so.13 and libnccl.so.2;
#  6. with --torch, tdist-torch113:VERSION and tdist-torch26:VERSION (docker/build.sh --torch): as
#     UID 65532 on a read-only root, tdist_torch imports with its C++ group built by the image's
#     build_ext.py, and examples/torch/ddp_train.py --backend tdist runs as a 2-rank DDP job under
#     the agent in one container (`--standalone --nproc-per-node 2`).
#
# Containers it starts are named tdist-test-image-PID-* and labelled tdist-test=image-PID; all are
# removed on exit. Prints PASS/FAIL lines and "N passed, N failed"; exit 0 only if nothing failed.
# Usage: docker/check_image.sh [--engine podman|docker] [--torch] [--keep]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine=""
torch=0
keep=0
npass=0
nfail=0
work=""
tag="tdist-test=image-$$"
cname="tdist-test-image-$$"

pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
finish() {
  echo "$npass passed, $nfail failed"
  [ "$nfail" -eq 0 ]
  exit
}

cleanup() {
  local ids
  ids="$("$engine" ps -aq --filter "label=$tag" 2>/dev/null || true)"
  [ -z "$ids" ] || "$engine" rm -f $ids >/dev/null 2>&1 || true
  if [ -n "$work" ]; then
    if [ "$keep" = 1 ]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
  fi
}

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --engine) engine="${2:?--engine needs podman or docker}"; shift ;;
      --torch) torch=1 ;;
      --keep) keep=1 ;;
      -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) echo "check_image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
  done
  if [ -z "$engine" ]; then
    if command -v podman >/dev/null; then engine=podman; else engine=docker; fi
  fi
}

# run_as ARGS...: a container of the image as the Job runs it (UID 65532, read-only root, no
# capabilities, a tmpfs /tmp), removed when it ends.
run_as() {
  "$engine" run --rm --label "$tag" --read-only --user 65532:65532 --cap-drop ALL --tmpfs /tmp "$@"
}

# stage_lines STAGE: the Dockerfile's lines of stage STAGE, continuation lines joined.
stage_lines() {
  awk -v s="$1" '/^FROM / { on = ($NF == s) } on' "$root/docker/Dockerfile" |
    sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -v '^#'
}

# apt_packages STAGE: the packages of the stage's `apt-get install` line.
apt_packages() {
  stage_lines "$1" | grep 'apt-get install' | sed 's/.*--no-install-recommends//; s/&&.*//' | tr -s ' ' '\n' | sed '/^$/d'
}

check_settings() {
  local fmt got want_ports
  fmt='{{.Config.User}}|{{json .Config.ExposedPorts}}|{{.Config.StopSignal}}|{{json .Config.Entrypoint}}'
  got="$("$engine" image inspect --format "$fmt" "$image")"
  want_ports="$(grep -oE 'containerPort: *[0-9]+' "$root/k8s/base/job.yaml" | grep -oE '[0-9]+' | sort -n |
    awk '{ printf "%s\"%s/tcp\":{}", (NR > 1 ? "," : ""), $1 }')"
  if [ "$got" = "65532:65532|{$want_ports}|SIGTERM|[\"/opt/tdist/bin/tdist-agent\"]" ]; then
    pass "$image: USER 65532:65532, EXPOSE {$want_ports} (= k8s/base/job.yaml), STOPSIGNAL SIGTERM, ENTRYPOINT tdist-agent"
  else
    fail "$image: settings '$got', want '65532:65532|{$want_ports}|SIGTERM|[\"/opt/tdist/bin/tdist-agent\"]'"
  fi
  local l v missing=""
  for l in title description version revision base.name; do
    v="$("$engine" image inspect --format "{{index .Config.Labels \"org.opencontainers.image.$l\"}}" "$image")"
    [ -n "$v" ] && [ "$v" != "<no value>" ] || missing+="$l "
  done
  v="$("$engine" image inspect --format '{{index .Config.Labels "org.opencontainers.image.version"}}' "$image")"
  if [ -z "$missing" ] && [ "$v" = "$version" ]; then pass "$image: OCI labels title, description, version ($v = version.h), revision, base.name"
  else fail "$image: labels missing: ${missing:-none}; version label '$v' (want $version)"; fi
}

# check_libraries: DT_NEEDED and RPATH of every ELF, resolved inside the image.
check_libraries() {
  local cid f rel rpath so sonames="" bad=0
  cid="$("$engine" create --label "$tag" "$image")"
  "$engine" cp "$cid:/opt/tdist" "$work/img" >/dev/null
  "$engine" rm "$cid" >/dev/null
  while IFS= read -r f; do
    readelf -h "$f" >/dev/null 2>&1 || continue
    rel="/opt/tdist${f#"$work/img"}"
    rpath="$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')"
    if [[ "$rpath" == *_solib* || "$rpath" == *bazel* ]]; then fail "$rel: RPATH/RUNPATH '$rpath' points into Bazel's tree"; bad=1; fi
    for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      if [ -e "$work/img/lib/$so" ]; then
        [[ "$rpath" == *'$ORIGIN/../lib'* || "$rpath" == */opt/tdist/lib* ]] ||
          { fail "$rel needs $so from /opt/tdist/lib without a RUNPATH to it"; bad=1; }
        continue
      fi
      sonames+="$so "
    done
  done < <(find "$work/img" -type f | sort)
  # SONAME -> package, by the image's own loader cache and dpkg database.
  local base listed pkgs used=" " line p
  base="$("$engine" image inspect --format '{{index .Config.Labels "org.opencontainers.image.base.name"}}' "$image")"
  pkgs="$("$engine" run --rm --label "$tag" --user 0 --entrypoint /bin/sh "$image" -c '
    for so in "$@"; do
      p=$(ldconfig -p | awk -v l="$so" "\$1 == l && /x86-64/ { print \$NF; exit }")
      [ -n "$p" ] || { echo "$so -"; continue; }
      for q in "$p" "$(readlink -f "$p")" "${p#/usr}" "/usr$p"; do
        k=$(dpkg -S "$q" 2>/dev/null | head -1 | cut -d: -f1)
        [ -z "$k" ] || break
      done
      echo "$so ${k:--}"
    done' sh $(echo "$sonames" | tr ' ' '\n' | sort -u))"
  local base_pkgs
  base_pkgs=" $("$engine" run --rm --label "$tag" --entrypoint dpkg-query "$base" -W -f '${Package} ' | sed 's/:amd64//g') "
  listed=" $(apt_packages cpu | tr '\n' ' ') "
  while read -r so p; do
    if [ "$p" = - ]; then fail "$image: no package in the image provides $so"; bad=1
    elif [[ "$listed" == *" $p "* ]]; then used+="$p "
    elif [[ "$base_pkgs" != *" $p "* ]]; then fail "$image: $so comes from $p, which neither the cpu stage's apt-get line nor $base installs"; bad=1
    fi
  done <<<"$pkgs"
  for p in $listed; do [[ "$used" == *" $p "* ]] || { fail "$image: the cpu stage installs $p, which no shipped ELF needs"; bad=1; }; done
  [ "$bad" = 1 ] || pass "$image: every DT_NEEDED met in the image by$(echo "$used" | tr -s ' ' | sed 's/ $//') (the cpu stage's apt-get line, each used) or $base; no RPATH into Bazel's tree"
}

# check_context: the build stage (a layer-cache hit of docker/build.sh's build) holds the Bazel
# workspace and nothing .dockerignore keeps out.
check_context() {
  local id ls cuda=()
  ! "$engine" image inspect localhost/tdist-cuda-headers:13 >/dev/null 2>&1 ||
    cuda=(--build-arg CUDA_DEVEL_IMAGE=localhost/tdist-cuda-headers:13)
  if ! id="$("$engine" build -q --target build "${cuda[@]}" -f "$root/docker/Dockerfile" "$root" 2>"$work/context.log")"; then
    fail "building the build stage from the cache: $(tail -3 "$work/context.log")"; return
  fi
  id="$(echo "$id" | tail -1)"
  # bazel-* links made by the stage's own build point into its output root, /build/bazel; a
  # checkout's would point elsewhere.
  ls="$("$engine" run --rm --label "$tag" --entrypoint /bin/sh "$id" -c 'cd /build/src && ls -A &&
    find . -maxdepth 1 -name "bazel-*" ! -lname "/build/bazel/*" -printf "LEAKED %p\n"')"
  local leaked
  leaked="$(echo "$ls" | grep -E '^\.git$|^LEAKED ' | tr '\n' ' ' || true)"
  if echo "$ls" | grep -qx WORKSPACE && echo "$ls" | grep -qx .bazelrc && [ -z "$leaked" ]; then
    pass "build context (the build stage's /build/src): WORKSPACE and .bazelrc in, no .git, no bazel-* but the stage's own ($(echo "$ls" | grep -c .) entries)"
  else
    fail "build context: WORKSPACE or .bazelrc missing, or leaked: $leaked"
  fi
}

check_runs() {
  local out cfg=(-v "$root/k8s/base/agent.yaml:/etc/tdist/agent.yaml:ro" --hostname tdist-train-0
    -e POD_NAME=tdist-train-0 -e POD_NAMESPACE=default -e JOB_COMPLETION_INDEX=0)
  out="$(run_as "$image" --version 2>&1)" || true
  [ "$out" = "tdist-agent $version" ] && pass "as UID 65532, read-only root, no capabilities: --version = '$out'" ||
    fail "--version: '$out' (want 'tdist-agent $version')"
  if run_as "${cfg[@]}" "$image" --config /etc/tdist/agent.yaml --check-config >"$work/check-config.log" 2>&1; then
    pass "--check-config of k8s/base/agent.yaml (exit 0)"
  else fail "--check-config of k8s/base/agent.yaml: $(tail -3 "$work/check-config.log")"; fi
  if timeout 300 "$engine" run --rm --label "$tag" --read-only --user 65532:65532 --cap-drop ALL --tmpfs /tmp \
       "$image" --standalone --nproc-per-node 2 -- /opt/tdist/bin/train >"$work/job.log" 2>&1 &&
     grep -q 'train: OK' "$work/job.log"; then
    pass "--standalone --nproc-per-node 2 -- /opt/tdist/bin/train: $(grep -m1 -o 'train: OK.*' "$work/job.log" | cut -c1-90)"
  else fail "2-worker job:"; tail -15 "$work/job.log" | sed 's/^/    | /'; fi
  if timeout 300 "$engine" run --rm --label "$tag" --read-only --user 65532:65532 --cap-drop ALL --tmpfs /tmp \
       "${cfg[@]}" "$image" --config /etc/tdist/agent.yaml --standalone --nnodes 1 >"$work/cfgjob.log" 2>&1 &&
     grep -q 'started 2 worker' "$work/cfgjob.log" && grep -q 'parameters bitwise identical on all 2 ranks' "$work/cfgjob.log" &&
     grep -q '"msg"' "$work/cfgjob.log" && ! grep -q 'Read-only file system\|Permission denied' "$work/cfgjob.log"; then
    pass "k8s/base/agent.yaml's job as pod 0 (its command, 2 workers, JSON logs, nothing written outside /tmp): exit 0"
  else fail "the ConfigMap's job:"; tail -15 "$work/cfgjob.log" | sed 's/^/    | /'; fi
  check_stop "${cfg[@]}"
  check_consumer
}

# check_stop CFG...: a long job in a detached container; probes from the host; stop = SIGTERM.
check_stop() {
  local c="$cname-stop" ip probes="" p code rc i
  "$engine" run -d --name "$c" --label "$tag" --read-only --user 65532:65532 --cap-drop ALL --tmpfs /tmp "$@" \
    "$image" --config /etc/tdist/agent.yaml --standalone --nnodes 1 -- /opt/tdist/bin/train --steps 100000000 --print-every 0 >/dev/null
  # (The logs go to a file: `logs | grep -q` would fail under pipefail when grep stops reading.)
  for i in $(seq 120); do
    "$engine" logs "$c" >"$work/stop.log" 2>&1 || true
    grep -q 'started 2 worker' "$work/stop.log" && break
    [ "$("$engine" inspect --format '{{.State.Running}}' "$c")" = true ] || break
    sleep 0.5
  done
  if ! grep -q 'started 2 worker' "$work/stop.log"; then
    fail "long job did not start its workers in 60 s:"; "$engine" logs "$c" 2>&1 | tail -10 | sed 's/^/    | /'; return
  fi
  ip="$("$engine" inspect --format '{{.NetworkSettings.IPAddress}}' "$c")"
  for p in healthz readyz; do
    code="$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://$ip:29600/$p" || true)"
    probes+="/$p $code "
  done
  [ "$probes" = "/healthz 200 /readyz 200 " ] && pass "probes from the host on the container's IP $ip:29600: ${probes% }" ||
    fail "probes on $ip:29600: $probes"
  "$engine" stop -t 40 "$c" >/dev/null
  rc="$("$engine" inspect --format '{{.State.ExitCode}}' "$c")"
  [ "$rc" = 143 ] && pass "$engine stop (STOPSIGNAL SIGTERM to the agent as PID 1): exit 143" ||
    { fail "$engine stop: exit $rc (want 143)"; "$engine" logs "$c" 2>&1 | tail -8 | sed 's/^/    | /'; }
  "$engine" rm -f "$c" >/dev/null
}

# check_consumer: a C program against the image's headers and libtdist.so, run in the image.
check_consumer() {
  mkdir -p "$work/c"
  printf '%s\n' '#include <stdio.h>' '#include <string.h>' '#include "tdist/tdist.h"' \
    'int main(void) { printf("%s\n", tdist_version()); return strcmp(tdist_version(), TDIST_VERSION_STRING) != 0; }' \
    >"$work/consumer.c"
  if ! gcc -std=c11 -Wall -Wextra -Werror -I"$work/img/include" "$work/consumer.c" -L"$work/img/lib" -ltdist \
       -Wl,-rpath,/opt/tdist/lib -o "$work/c/consumer" 2>"$work/consumer.log"; then
    fail "a C program against the image's /opt/tdist/include and libtdist.so does not build: $(head -5 "$work/consumer.log")"; return
  fi
  local out
  out="$(run_as -v "$work/c:/mnt/c:ro" --entrypoint /mnt/c/consumer "$image" 2>&1)" &&
    pass "a C program built with -I/opt/tdist/include -ltdist (from the image) runs in it as UID 65532: $out" ||
    fail "the C program in the image: $out"
}

# check_gpu_static: what can be checked of the gpu stage without its base image.
check_gpu_static() {
  local cpu gpu p gp missing=""
  cpu="$(stage_lines cpu | grep -E '^(COPY|USER|EXPOSE|STOPSIGNAL|ENTRYPOINT|ENV) ')"
  gpu="$(stage_lines gpu | grep -E '^(COPY|USER|EXPOSE|STOPSIGNAL|ENTRYPOINT|ENV) ')"
  [ "$cpu" = "$gpu" ] && pass "gpu stage (not buildable here: its base is NVIDIA's): the same COPY, ENV, USER, EXPOSE, STOPSIGNAL, ENTRYPOINT as cpu" ||
    fail "gpu stage differs from cpu in COPY/ENV/USER/EXPOSE/STOPSIGNAL/ENTRYPOINT: $(diff <(echo "$cpu") <(echo "$gpu") | tr '\n' ' ')"
  gp=" $(apt_packages gpu | tr '\n' ' ') "
  for p in $(apt_packages cpu); do [[ "$gp" == *" $p "* || "$gp" == *" ${p}t64 "* ]] || missing+="$p "; done
  [ -z "$missing" ] && pass "gpu stage installs the Ubuntu 24.04 names of the cpu stage's packages:${gp% }" ||
    fail "gpu stage lacks (the Ubuntu name of) $missing"
  local runs
  runs="$(stage_lines gpu | grep '^RUN')"
  [[ "$runs" == *libcudart.so.13* && "$runs" == *libnccl.so.2* ]] &&
    pass "gpu stage: a RUN checks that libcudart.so.13 and libnccl.so.2 are in the loader cache" ||
    fail "gpu stage: no RUN checks libcudart.so.13 and libnccl.so.2"
}

# check_torch IMAGE WANT: docs/pytorch.md's recipe on a PyTorch image: the C++ group, a DDP job.
check_torch() {
  local img="$1" want="$2" out
  if ! "$engine" image inspect "$img" >/dev/null 2>&1; then fail "$img: not built (bash docker/build.sh --torch)"; return; fi
  out="$(run_as "$img" --version 2>&1)" || true
  [ "$out" = "tdist-agent $version" ] && pass "$img: the entrypoint tdist-agent runs as UID 65532 (its libraries installed): $out" ||
    fail "$img: tdist-agent --version: $out"
  out="$(run_as --entrypoint python3 -e PYTHONPATH=/opt/tdist/python "$img" -c '
import torch, tdist_torch
print(torch.__version__, tdist_torch.implementation)' 2>&1)" || true
  [[ "$out" == "$want"*" cpp"* ]] && pass "$img: PyTorch $(echo "$out" | cut -c1-60)..." ||
    fail "$img: tdist_torch's C++ group for PyTorch $want: $out"
  # Without pybind11's headers (which Debian's libtorch-dev does not pull in), build_ext.py says
  # what to install instead of leaving the user with g++'s error.
  out="$("$engine" run --rm --label "$tag" --user 0 --entrypoint /bin/sh "$img" -c \
    'rm -rf /usr/include/pybind11 && python3 /opt/tdist/python/tdist_torch/build_ext.py --out /tmp/x.so' 2>&1)" &&
    fail "$img: build_ext.py without pybind11's headers succeeded?" ||
    { [[ "$out" == *"apt-get install pybind11-dev"* ]] && pass "$img: build_ext.py without pybind11's headers says: ${out#*build_ext: no }" ||
      fail "$img: build_ext.py without pybind11's headers: $(echo "$out" | tail -3)"; }
  if timeout 300 "$engine" run --rm --label "$tag" --read-only --user 65532:65532 --cap-drop ALL --tmpfs /tmp \
       -v "$root/examples/torch:/mnt/examples:ro" "$img" --standalone --nproc-per-node 2 -- \
       python3 /mnt/examples/ddp_train.py --backend tdist >"$work/ddp.log" 2>&1 && grep -q '^done: world 2' "$work/ddp.log"; then
    pass "$img: ddp_train.py --backend tdist, 2 ranks under the agent in one container: $(grep -m1 '^done:' "$work/ddp.log" | cut -c1-80)"
  else fail "$img: 2-rank DDP job on tdist:"; tail -20 "$work/ddp.log" | sed 's/^/    | /'; fi
}

main() {
  parse_args "$@"
  [ "$(id -u)" -eq 0 ] || { fail "must run as root (the engine's images are root's)"; finish; }
  trap cleanup EXIT
  version="$(sed -n 's/^#define TDIST_VERSION_STRING "\(.*\)"/\1/p' "$root/include/tdist/version.h")"
  image="tdist:$version"
  work="$(mktemp -d "${TMPDIR:-/tmp}/tdist-image-check.XXXXXX")"
  "$engine" image inspect "$image" >/dev/null 2>&1 || { fail "$engine has no $image: run bash docker/build.sh"; finish; }
  check_settings
  check_libraries
  check_context
  check_runs
  check_gpu_static
  if [ "$torch" = 1 ]; then
    check_torch "tdist-torch113:$version" 1.13
    check_torch "tdist-torch26:$version" 2.6
  fi
  finish
}

main "$@"
