#!/usr/bin/env bash
# Checks docker/Dockerfile without a container engine, by doing its steps for real on this Debian 12
# machine (the OS of debian:bookworm) as root:
#
#  1. reads the Dockerfile (docker/dockerfile_tool.py: stages, ARG/ENV, COPY, RUN, ...) and checks
#     the stage layout: build FROM debian:bookworm, cpu FROM debian:bookworm-slim and last (the
#     default target), gpu FROM a CUDA 13 runtime image;
#  2. checks .dockerignore at the context root (what must get in, what must stay out) and copies
#     the context honouring it, as `COPY . .` would;
#  3. replays the build stage in a fresh directory T: every path of that stage lies under its
#     WORKDIR's top directory (/build), which maps to T/build, and its RUN commands (relative paths
#     only; checked) run there with /bin/sh and only the stage's environment. The apt-get step is
#     checked, not run (every package installed here and resolvable with --no-install-recommends):
#     running it would change this machine. A COPY from a stage that cannot run here
#     (cuda-headers, FROM an NVIDIA image) is stood in for by this machine's /usr/local/cuda;
#  4. assembles the cpu stage's file tree R from its COPY --from=build lines, checks that every
#     DT_NEEDED library of every shipped ELF comes from the stage's apt packages or from the base
#     image (libc6, libgcc-s1, libstdc++6: in debian:bookworm-slim since apt needs them), that no
#     package is installed for nothing, and that no RPATH points into Bazel's tree; checks USER,
#     EXPOSE (= the ports in k8s/base/job.yaml), STOPSIGNAL, ENTRYPOINT and the labels;
#  5. runs the image's files at their image paths in a private mount/PID/network/UTS namespace
#     (hostname tdist-train-0, as pod 0 of the Indexed Job; R/opt bind-mounted read-only over /opt, every other mount read-only, fresh tmpfs on /tmp and
#     /dev/shm like the pod's emptyDirs, loopback only): the stage's own RUN smoke test as root,
#     then as UID 65532 with no capabilities and no_new_privs: --version, --check-config of
#     k8s/base/agent.yaml, a 2-worker job of the config's command (/opt/tdist/bin/train) with the
#     agent as PID 1 and the config's ports, its /healthz and /readyz, SIGTERM as `docker stop`
#     sends it (exit 143), a C program built against /opt/tdist/include and libtdist.so, and
#     tdist_torch's C++ group built by the shipped build_ext.py and run under PyTorch 1.13;
#  6. checks the gpu stage statically (same files and settings as cpu, Ubuntu names of the same
#     packages); its loader checks for libcudart.so.13 and libnccl.so.2 run in `docker build`.
#
# Usage: docker/check_build.sh [--keep] [--prebuilt PATH...]
#   (no option)  full: the build stage's `bazel build` runs for real (a separate Bazel output
#                root under T, --batch: minutes on 2 cores; used by .ci/test)
#   --prebuilt   skip the RUN that calls bazel and place already built outputs under
#                bazel-bin/ instead (PATH: relative to the repository root = their bazel-bin
#                path); every other step is the same (used by //tests/docker:docker_build_test)
#   --keep       keep the work directory
# Prints PASS/FAIL/NOTE lines and "N passed, N failed"; exit status 0 only if nothing failed.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=/usr/bin/python3
TOOL="$root/docker/dockerfile_tool.py"
DF="$root/docker/Dockerfile"
keep=0
prebuilt=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --prebuilt) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do prebuilt+=("$1"); shift; done
                [ ${#prebuilt[@]} -gt 0 ] || { echo "check_build.sh: --prebuilt needs paths" >&2; exit 2; }
                continue ;;
    -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check_build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

npass=0 nfail=0
pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
note() { echo "NOTE: $*"; }
finish() {
  echo "$npass passed, $nfail failed"
  [ "$nfail" -eq 0 ] && exit 0 || exit 1
}

if [ "$(id -u)" -ne 0 ]; then fail "must run as root (it replays the Dockerfile as root and switches to UID 65532)"; finish; fi
work="$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/tdist-docker-check.XXXXXX")"
chmod 755 "$work"
cleanup() {
  if [ "$keep" = 1 ]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir -p "$work/logs"

# ---- 1. the Dockerfile ------------------------------------------------------------------------
if ! "$PY" "$TOOL" parse "$DF" >"$work/plan.tsv" 2>"$work/logs/parse.err"; then
  fail "cannot read docker/Dockerfile: $(cat "$work/logs/parse.err")"; finish
fi
# rec KIND STAGE: the fields after KIND and STAGE of every matching record, tab-separated.
rec() { awk -F'\t' -v k="$1" -v s="$2" '$1 == k && $2 == s { sub(/^[^\t]*\t[^\t]*\t/, ""); print }' "$work/plan.tsv"; }
base_of() { awk -F'\t' -v s="$1" '$1 == "stage" && $2 == s { print $3 }' "$work/plan.tsv"; }
stages="$(awk -F'\t' '$1 == "stage" { printf "%s ", $2 }' "$work/plan.tsv")"
last="$(awk -F'\t' '$1 == "stage" { s = $2 } END { print s }' "$work/plan.tsv")"
if [ "$(base_of build)" = debian:bookworm ] && [ "$(base_of cpu)" = debian:bookworm-slim ] &&
   [ "$last" = cpu ]; then
  pass "stages: $stages(build FROM debian:bookworm, cpu FROM debian:bookworm-slim and last = default target)"
else
  fail "stages: $stages: want build FROM debian:bookworm, cpu FROM debian:bookworm-slim, cpu last (got build=$(base_of build) cpu=$(base_of cpu) last=$last)"
  [ -n "$(base_of build)" ] && [ -n "$(base_of cpu)" ] || finish
fi
if [[ "$(base_of gpu)" =~ ^nvidia/cuda:13\.[0-9.]+-runtime- ]]; then pass "gpu FROM $(base_of gpu) (CUDA 13 runtime)"
else fail "gpu stage: FROM '$(base_of gpu)' is not an nvidia/cuda:13.x runtime image"; fi
. /etc/os-release
if [ "${VERSION_CODENAME:-}" = bookworm ] && [ "$(uname -m)" = x86_64 ]; then
  pass "this machine is Debian 12 (bookworm) x86-64, the OS of the build and cpu stages"
else
  fail "this machine is ${PRETTY_NAME:-unknown} $(uname -m): the replay needs Debian 12 x86-64"; finish
fi

# ---- 2. .dockerignore and the context ---------------------------------------------------------
if [ ! -f "$root/.dockerignore" ]; then
  fail ".dockerignore missing at the context root ($root)"
else
  want_in=(WORKSPACE .bazelrc BUILD include/tdist/tdist.h runtime/BUILD operator-agent/main.c
           examples/train/train.c third_party/cuda.BUILD third_party/bazel/rules_cc/cc/defs.bzl)
  want_out=(.git/HEAD bazel-bin bazel-out/k8-opt/bin/x bazel-main bazel-testlogs runtime/x.o
            tests/x/__pycache__/y.pyc)
  bad="$("$PY" "$TOOL" ignored "$root" "${want_in[@]}" | grep '^excluded' || true)"
  bad+="$("$PY" "$TOOL" ignored "$root" "${want_out[@]}" | grep '^included' || true)"
  if [ -z "$bad" ]; then pass ".dockerignore keeps the Bazel workspace in and .git, bazel-*, *.o, __pycache__ out"
  else fail ".dockerignore: $(echo "$bad" | tr '\n' ' ')"; fi
fi
deref=()
[ ${#prebuilt[@]} -gt 0 ] && deref=(--dereference)   # a runfiles tree is made of links
if sizes="$("$PY" "$TOOL" copy-context "$root" "$work/context" "${deref[@]}" 2>&1)"; then
  leaked="$(cd "$work/context" && ls -d .git bazel-* 2>/dev/null | tr '\n' ' ')"
  if [ -z "$leaked" ]; then pass "build context: ${sizes% *} files, $(( ${sizes#* } / 1024 )) KiB, nothing ignored got in"
  else fail "build context holds $leaked"; fi
else
  fail "copying the context: $sizes"; finish
fi

# ---- helpers for the replay -------------------------------------------------------------------
# stage_env STAGE: NAME=VALUE lines of the stage's ARGs and ENVs, last one wins, plus HOME=/root
# as Docker sets it for root.
stage_env() {
  { printf 'PATH\t/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nHOME\t/root\n'
    awk -F'\t' -v s="$1" '($1 == "arg" || $1 == "env") && $2 == s { print $3 "\t" $4 }' "$work/plan.tsv"
  } | awk -F'\t' '{ v[$1] = $2; if (!($1 in o)) { o[$1] = n++; k[n - 1] = $1 } }
                  END { for (i = 0; i < n; i++) print k[i] "=" v[k[i]] }'
}
is_apt() { [[ "$1" =~ (^|[^[:alnum:]-])apt-get[[:space:]] ]]; }
# check_apt STAGE CMD: the packages of CMD are installed here and apt resolves them.
check_apt() {
  local stage="$1" pkgs missing=() p
  mapfile -t pkgs < <("$PY" "$TOOL" apt-packages "$2" </dev/null)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#pkgs[@]} -eq 0 ]; then fail "$stage: apt-get step installs nothing?"; return; fi
  if [ ${#missing[@]} -gt 0 ]; then
    fail "$stage: packages not installed on this machine: ${missing[*]} (apt-get install them, or fix the names)"
  elif ! apt-get install -s --no-install-recommends "${pkgs[@]}" >"$work/logs/apt-$stage.log" 2>&1 </dev/null; then
    fail "$stage: apt-get -s --no-install-recommends ${pkgs[*]}: $(tail -2 "$work/logs/apt-$stage.log")"
  else
    pass "$stage: apt packages installed here and resolvable: ${pkgs[*]}"
  fi
  printf '%s\n' "${pkgs[@]}" >"$work/apt-$stage.txt"
}

# ---- 3. the build stage -----------------------------------------------------------------------
T="$work/build-root"
wd="$(rec workdir build | tail -1)"
top="/$(echo "$wd" | cut -d/ -f2)"
if [ -z "$wd" ] || [ "$top" = / ]; then fail "build stage: no WORKDIR below /; its paths cannot be mapped"; finish; fi
mapfile -t build_env < <(stage_env build)
cur=/
n=0
while IFS=$'\t' read -r kind stage a b rest; do
  [ "$stage" = build ] || continue
  case "$kind" in
    workdir) cur="$a"; mkdir -p "$T$cur" ;;
    copy)
      from="$a" dest="$b"
      if [ "$from" = - ]; then
        case "$dest" in "$top"/*) ;; *) fail "build: COPY to $dest is outside $top"; continue ;; esac
        for src in $rest; do
          mkdir -p "$T$dest"
          if [ "$src" = . ]; then cp -a "$work/context/." "$T$dest"; else cp -a "$work/context/$src" "$T$dest"; fi
        done
        pass "build: COPY $rest $dest (the context, $(find "$T$dest" -type f | wc -l) files)"
      elif [ "$from" = cuda-headers ]; then
        # Stand-in: WORKSPACE's new_local_repository reads /usr/local/cuda; here it is the
        # machine's own CUDA 13 tree.
        if [ -f "$dest/nccl.h" ] && [ -f "$dest/cuda_runtime_api.h" ]; then
          pass "build: COPY --from=cuda-headers $rest $dest: stood in for by this machine's $dest (nccl.h, cuda_runtime_api.h present)"
        else fail "build: COPY --from=cuda-headers to $dest: no nccl.h/cuda_runtime_api.h there to stand in"; fi
      else fail "build: COPY --from=$from cannot be replayed"; fi ;;
    run)
      n=$((n + 1))
      cmd="$a"
      if is_apt "$cmd"; then check_apt build "$cmd"; continue; fi
      if [[ "$cmd" =~ (^|[^[:alnum:]_.-])$top(/|[^[:alnum:]_.-]|$) ]]; then
        fail "build: RUN #$n names $top: use paths relative to WORKDIR $wd so that it can be replayed"; continue
      fi
      if [[ "$cmd" =~ (^|[[:space:];&|])bazel[[:space:]] ]] && [ ${#prebuilt[@]} -gt 0 ]; then
        for p in "${prebuilt[@]}"; do
          mkdir -p "$(dirname "$T$cur/bazel-bin/$p")"
          cp -L "$root/$p" "$T$cur/bazel-bin/$p" || fail "build: prebuilt $p missing"
        done
        note "build: RUN #$n (bazel build) not run: --prebuilt placed ${prebuilt[*]} under bazel-bin/"
        continue
      fi
      t0=$(date +%s)
      if (cd "$T$cur" && env -i "${build_env[@]}" /bin/sh -c "$cmd") >"$work/logs/build-run$n.log" 2>&1 </dev/null; then
        pass "build: RUN #$n ($(echo "$cmd" | awk '{print $1, $2, $3}') ...) in $(( $(date +%s) - t0 ))s"
      else
        fail "build: RUN #$n exited $? after $(( $(date +%s) - t0 ))s: $cmd"
        sed 's/^/    | /' "$work/logs/build-run$n.log" | tail -25
      fi ;;
  esac
done <"$work/plan.tsv"
# No Bazel server is left (--batch); Bazel's output root under T goes with the work directory.

# ---- 4. the cpu stage's file tree -------------------------------------------------------------
R="$work/cpu-root"
mkdir -p "$R"
copy_from_build() {  # STAGE ROOT: COPY --from=build into ROOT; sets DESTS; status 1 on a failure
  local stage="$1" into="$2" from dest src ok=1
  DESTS=""
  while IFS=$'\t' read -r from dest src; do
    [ "$from" = build ] || { fail "$stage: COPY --from=$from: only the build stage is expected"; ok=0; continue; }
    if [ ! -e "$T$src" ]; then fail "$stage: COPY --from=build $src: not in the build stage"; ok=0; continue; fi
    mkdir -p "$into$dest"
    if [ -d "$T$src" ]; then cp -a "$T$src/." "$into$dest"; else cp -a "$T$src" "$into$dest"; fi
    DESTS+="$dest "
  done < <(rec copy "$stage")
  return $((1 - ok))
}
copy_from_build cpu "$R" && pass "cpu: every COPY --from=build source exists: ${DESTS% }"
dests="$DESTS"
rec run cpu | while IFS= read -r cmd; do is_apt "$cmd" && echo "$cmd"; done >"$work/cpu-apt-cmds"
if [ -s "$work/cpu-apt-cmds" ]; then check_apt cpu "$(cat "$work/cpu-apt-cmds")"; else fail "cpu: no apt-get step"; : >"$work/apt-cpu.txt"; fi
echo "    image tree: $(cd "$R" && find . -type f | sort | tr '\n' ' ')"

# ELF dependencies: each DT_NEEDED from the image, a listed package, or the base image.
base_pkgs=" libc6 libgcc-s1 libstdc++6 "
list_pkgs=" $(tr '\n' ' ' <"$work/apt-cpu.txt") "
used_pkgs=" "
dep_fail=0
declare -A pkg_cache
pkg_of() {  # SONAME -> the Debian package that ships it here (merged-/usr aware)
  local path p
  [ -n "${pkg_cache[$1]:-}" ] && { echo "${pkg_cache[$1]}"; return 0; }
  path="$(ldconfig -p | awk -v l="$1" '$1 == l && /x86-64/ { print $NF; exit }')"
  [ -n "$path" ] || return 1
  for p in "$path" "$(realpath "$path")" "${path#/usr}" "/usr$path"; do
    pkg_cache[$1]="$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1)"
    [ -n "${pkg_cache[$1]}" ] && { echo "${pkg_cache[$1]}"; return 0; }
  done
  return 1
}
while IFS= read -r f; do
  readelf -h "$f" >/dev/null 2>&1 || continue
  rel="${f#"$R"}"
  rpath="$(readelf -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p')"
  if [[ "$rpath" == *_solib* || "$rpath" == *bazel* ]]; then
    fail "$rel: RPATH/RUNPATH '$rpath' points into Bazel's tree"; dep_fail=1
  fi
  for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    if [ -e "$R/opt/tdist/lib/$so" ]; then
      if [[ "$rpath" == *'$ORIGIN/../lib'* || "$rpath" == */opt/tdist/lib* ]]; then continue; fi
      fail "$rel needs $so from /opt/tdist/lib but has no RUNPATH to it (would need LD_LIBRARY_PATH)"; dep_fail=1; continue
    fi
    if [ ${#prebuilt[@]} -gt 0 ] && [[ "$so" =~ ^lib(asan|ubsan|tsan|lsan)\.so ]]; then
      note "$rel needs $so: a sanitizer build passed with --prebuilt (the image's -c opt build has none)"; continue
    fi
    pkg_of "$so" >"$work/pkg" || true   # not in a subshell: the cache must survive
    pkg="$(cat "$work/pkg")"
    if [ -z "$pkg" ]; then fail "$rel needs $so, which no package on this machine ships"; dep_fail=1; continue; fi
    if [[ "$list_pkgs" == *" $pkg "* ]]; then used_pkgs+="$pkg "
    elif [[ "$base_pkgs" != *" $pkg "* ]]; then
      fail "$rel needs $so from package $pkg, which the cpu stage does not install (add it to its apt-get line)"; dep_fail=1
    fi
  done
done < <(find "$R" -type f | sort)
unused=""
for p in $list_pkgs; do [[ "$used_pkgs" == *" $p "* ]] || unused+="$p "; done
if [ -n "$unused" ]; then fail "cpu: installs ${unused% } but no shipped ELF needs it"; dep_fail=1; fi
[ "$dep_fail" = 0 ] && pass "cpu: every DT_NEEDED is met: packages$(echo "$used_pkgs" | tr -s ' ' | sed 's/ $//') + base image ($(echo $base_pkgs)); no RPATH into Bazel's tree"

# Image settings.
ver="$(rec arg cpu | awk -F'\t' '$1 == "IMAGE_VERSION" { v = $2 } END { print v }')"
hver="$(sed -n 's/^#define TDIST_VERSION_STRING "\(.*\)"/\1/p' "$root/include/tdist/version.h" 2>/dev/null)"
[ -n "$hver" ] || hver="$(sed -n 's/^#define TDIST_VERSION_STRING "\(.*\)"/\1/p' "$R/opt/tdist/include/tdist/version.h")"
[ "$ver" = "$hver" ] && pass "cpu: IMAGE_VERSION $ver = TDIST_VERSION_STRING of include/tdist/version.h" ||
  fail "cpu: build arg IMAGE_VERSION '$ver' differs from version.h's '$hver'"
check_settings() {  # STAGE
  local s="$1" ports entry
  [ "$(rec user "$s" | tail -1)" = 65532:65532 ] || fail "$s: USER is '$(rec user "$s" | tail -1)', want 65532:65532"
  ports="$(rec expose "$s" | tr '\t' '\n' | sort -n | tr '\n' ' ')"
  [ "$ports" = "$kports" ] || fail "$s: EXPOSE '$ports' differs from k8s/base/job.yaml's containerPorts '$kports'"
  [ "$(rec stopsignal "$s")" = SIGTERM ] || fail "$s: STOPSIGNAL is '$(rec stopsignal "$s")', want SIGTERM"
  entry="$(rec entrypoint "$s")"
  [ "$entry" = '["/opt/tdist/bin/tdist-agent"]' ] || fail "$s: ENTRYPOINT is $entry, want [\"/opt/tdist/bin/tdist-agent\"]"
  for l in title description version revision base.name; do
    rec label "$s" | grep -q "^org.opencontainers.image.$l	." || fail "$s: no label org.opencontainers.image.$l"
  done
  [ "$(rec label "$s" | awk -F'\t' '$1 == "org.opencontainers.image.version" { print $2 }')" = "$ver" ] ||
    fail "$s: label org.opencontainers.image.version is not $ver"
}
kports="$(grep -oE 'containerPort: *[0-9]+' "$root/k8s/base/job.yaml" | grep -oE '[0-9]+' | sort -n | tr '\n' ' ')"
before=$nfail
check_settings cpu
[ "$nfail" = "$before" ] && pass "cpu: USER 65532:65532, EXPOSE $kports(= job.yaml), STOPSIGNAL SIGTERM, ENTRYPOINT [\"/opt/tdist/bin/tdist-agent\"], OCI labels, version $ver"
kcmd="$(sed -n 's/^command: *\[\([^],]*\).*/\1/p' "$root/k8s/base/agent.yaml" | tr -d '"' | tr -d "'")"
[ -n "$kcmd" ] && [ -x "$R$kcmd" ] && pass "cpu: k8s/base/agent.yaml's command $kcmd is in the image" ||
  fail "cpu: k8s/base/agent.yaml's command '$kcmd' is not an executable in the image"

if [ ! -x "$R/opt/tdist/bin/tdist-agent" ]; then fail "cpu: no /opt/tdist/bin/tdist-agent in the image: nothing to run"; finish; fi

# ---- 5. running it ----------------------------------------------------------------------------
# The namespace's set-up, as root, then exec as VIEW_USER (if set) with only the image's env.
cat >"$work/view.sh" <<'EOF'
set -eu
mapfile -t E <"$VIEW_ENV"   # before /tmp is covered (the work directory may be under it)
for d in "$VIEW_ROOT"/*; do
  top="/$(basename "$d")"
  case "$top" in /etc | /usr | /lib* | /bin | /sbin | /var | /tmp | /dev | /proc | /sys)
    echo "view: the image tree has $top, which cannot be laid over this machine's" >&2; exit 90 ;; esac
  [ -d "$top" ] || { echo "view: no $top on this machine to mount over" >&2; exit 90; }
  mount --bind "$d" "$top"; mount -o remount,bind,ro "$top"
done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$VIEW_NEWTMP"
cp -a "$VIEW_PUT/." "$VIEW_NEWTMP/"; chmod 1777 "$VIEW_NEWTMP"   # like an emptyDir
mount --move "$VIEW_NEWTMP" /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
ip link set lo up
while read -r _ _ _ _ mp opts _; do
  case "$mp" in /proc | /proc/* | /sys | /sys/* | /dev | /dev/* | /tmp) continue ;; esac
  case ",$opts," in *,rw,*) mount -o remount,bind,ro "$mp" 2>/dev/null || echo "view: $mp stays writable" >&2 ;; esac
done </proc/self/mountinfo
if [ -n "$VIEW_USER" ]; then
  exec setpriv --reuid="${VIEW_USER%:*}" --regid="${VIEW_USER#*:}" --clear-groups --no-new-privs \
    --bounding-set=-all --inh-caps=-all -- env -i "${E[@]}" "$@"
fi
exec env -i "${E[@]}" "$@"
EOF
mkdir -p "$work/put" "$work/newtmp"
cp "$root/k8s/base/agent.yaml" "$work/put/agent.yaml"
# The container's environment: the stage's ENV (not its ARGs), HOME=/ for a UID without a passwd
# entry, and what the Job's pod spec sets.
stage_env cpu | grep -vE "^($(rec arg cpu | cut -f1 | paste -sd'|'))=" | sed 's#^HOME=.*#HOME=/#' >"$work/env.image"
{ cat "$work/env.image"; echo HOSTNAME=tdist-train-0; echo POD_NAME=tdist-train-0
  echo POD_NAMESPACE=default; echo POD_IP=127.0.0.1; echo JOB_COMPLETION_INDEX=0; } >"$work/env.pod"
# view USER ENVFILE CMD...: sets VIEW (the argv; run it, or start it in the background).
view() {
  VIEW=(env VIEW_ROOT="$R" VIEW_PUT="$work/put" VIEW_NEWTMP="$work/newtmp" VIEW_USER="$1" VIEW_ENV="$2"
        unshare --mount --propagation private --pid --fork --kill-child --mount-proc --net --uts
        /bin/bash -c "hostname tdist-train-0; $(cat "$work/view.sh")" view)
  shift 2
  VIEW+=("$@")
}

# 5a. The stage's own RUN commands (the smoke test), as root, in the image's view.
mapfile -t rootenv < <(stage_env cpu)
printf '%s\n' "${rootenv[@]}" >"$work/env.root"
while IFS= read -r cmd; do
  is_apt "$cmd" && continue
  view "" "$work/env.root" /bin/sh -c "$cmd"
  if "${VIEW[@]}" >"$work/logs/cpu-run.log" 2>&1 </dev/null; then
    pass "cpu: RUN '$(echo "$cmd" | tr -s ' ' | cut -c1-70)...' in the image view: $(tail -1 "$work/logs/cpu-run.log")"
  else fail "cpu: RUN '$cmd' failed in the image view:"; sed 's/^/    | /' "$work/logs/cpu-run.log" | tail -10; fi
done < <(rec run cpu)

# 5b. As the image's user.
U="$(rec user cpu | tail -1)"
view "$U" "$work/env.image" /opt/tdist/bin/tdist-agent --version
out="$("${VIEW[@]}" 2>&1 </dev/null)"
[ "$out" = "tdist-agent $ver" ] && pass "as UID $U, read-only /: tdist-agent --version = '$out'" ||
  fail "tdist-agent --version as UID $U: '$out' (want 'tdist-agent $ver')"
view "$U" "$work/env.pod" /opt/tdist/bin/tdist-agent --config /tmp/agent.yaml --check-config
if "${VIEW[@]}" >"$work/logs/check-config.log" 2>&1 </dev/null; then
  pass "as UID $U: --config k8s/base/agent.yaml --check-config (exit 0, $(grep -c . "$work/logs/check-config.log") lines)"
else fail "--check-config of k8s/base/agent.yaml: $(tail -3 "$work/logs/check-config.log")"; fi

# A C program against the installed headers and libtdist.so (same sanitizer as the library).
san=""
readelf -d "$R/opt/tdist/lib/libtdist.so" | grep -q 'libasan' && san=-fsanitize=address
readelf -d "$R/opt/tdist/lib/libtdist.so" | grep -q 'libubsan' && san=-fsanitize=undefined
printf '%s\n' '#include <stdio.h>' '#include <string.h>' '#include "tdist/tdist.h"' \
  'int main(void) { printf("%s\n", tdist_version()); return strcmp(tdist_version(), TDIST_VERSION_STRING) != 0; }' \
  >"$work/consumer.c"
if gcc -std=c11 -Wall -Wextra -Werror $san -I"$R/opt/tdist/include" "$work/consumer.c" -L"$R/opt/tdist/lib" \
     -ltdist -Wl,-rpath,/opt/tdist/lib -o "$work/put/consumer" 2>"$work/logs/consumer.log"; then
  view "$U" "$work/env.image" /tmp/consumer
  out="$("${VIEW[@]}" 2>&1 </dev/null)" && pass "a C program built with -I/opt/tdist/include -ltdist runs as UID $U: tdist_version() = $out" ||
    fail "C program against libtdist.so: $out"
else fail "C program against /opt/tdist/include + libtdist.so does not build: $(head -5 "$work/logs/consumer.log")"; fi

# tdist_torch's C++ group built from the image's files as a derived image would (build_ext.py
# with its defaults: the headers in /opt/tdist/include) for this machine's PyTorch 1.13, then a
# 1-rank "tdist" job on it as UID $U. Needs python3-torch and libtorch-dev (.ci/packages.txt).
if [ -n "$san" ]; then
  echo "NOTE: libtdist is built with $san (a sanitizer run): tdist_torch's C++ group is checked by the normal build's run"
elif /usr/bin/python3 -c 'import torch' 2>/dev/null && [ -d /usr/include/torch/csrc/distributed/c10d ]; then
  ext="$(/usr/bin/python3 -c 'import sys, torch
print("_tdist_c-torch%s-%s.so" % (torch.__version__.split("+")[0], sys.implementation.cache_tag))')"
  if /usr/bin/python3 "$R/opt/tdist/python/tdist_torch/build_ext.py" --out "$work/put/$ext" \
       >"$work/logs/build_ext.log" 2>&1; then
    view "$U" "$work/env.image" /usr/bin/env PYTHONPATH=/opt/tdist/python TDIST_TORCH_EXT="/tmp/$ext" \
      TDIST_TORCH_IMPL=cpp MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 RANK=0 WORLD_SIZE=1 /usr/bin/python3 -c '
import torch, torch.distributed as dist, tdist_torch
dist.init_process_group("tdist")
t = torch.arange(5.0)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0], t
print(tdist_torch.implementation.split(" ")[0], type(dist.group.WORLD).__name__)
dist.destroy_process_group()'
    out="$("${VIEW[@]}" 2>&1 </dev/null)"
    [ "$out" = "cpp Group" ] && pass "tdist_torch's C++ group builds from /opt/tdist (build_ext.py, PyTorch 1.13) and runs a job as UID $U" ||
      fail "tdist_torch's C++ group from /opt/tdist: $(echo "$out" | tail -3)"
  else fail "build_ext.py from /opt/tdist/python/tdist_torch: $(tail -5 "$work/logs/build_ext.log")"; fi
else
  echo "NOTE: no PyTorch 1.13 with C++ headers here (python3-torch, libtorch-dev): tdist_torch's build_ext.py not checked"
fi

# The pod: the ConfigMap's settings and command, one node (--standalone --nnodes 1), the agent as
# PID 1 on the config's ports 29500/29600 in its own network namespace.
agent_job() {  # LOG ARGS...: starts the job in the background; sets APID (its host PID), JPID
  local log="$1"; shift
  view "$U" "$work/env.pod" /opt/tdist/bin/tdist-agent --config /tmp/agent.yaml --standalone --nnodes 1 "$@"
  "${VIEW[@]}" >"$log" 2>&1 </dev/null &
  JPID=$!
  APID=""
  for _ in $(seq 100); do
    APID="$(ps -o pid= --ppid "$JPID" | tr -d ' ' | head -1)"
    [ -n "$APID" ] && break
    sleep 0.05
  done
}
wait_job() {  # SECONDS: waits for the job; kills its PID 1 after SECONDS; sets RC
  for _ in $(seq $(($1 * 10))); do kill -0 "$JPID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$JPID" 2>/dev/null && { echo "    (killing the job after $1 s)"; kill -KILL "$APID" "$JPID" 2>/dev/null; }
  wait "$JPID"; RC=$?
}
wait_for() {  # PATTERN FILE SECONDS
  for _ in $(seq $(($3 * 10))); do grep -q "$1" "$2" 2>/dev/null && return 0; kill -0 "$JPID" 2>/dev/null || break; sleep 0.1; done
  grep -q "$1" "$2" 2>/dev/null
}
t0=$(date +%s)
agent_job "$work/logs/job.log"
wait_job 120
if [ "$RC" = 0 ] && grep -q 'parameters bitwise identical on all 2 ranks' "$work/logs/job.log" &&
   grep -q 'started 2 worker' "$work/logs/job.log"; then
  pass "pod: agent as PID 1, UID $U, read-only /, ran the ConfigMap's command with 2 workers to success in $(( $(date +%s) - t0 ))s"
else
  fail "pod: 2-worker job of the ConfigMap's command: exit $RC"; sed 's/^/    | /' "$work/logs/job.log" | tail -15
fi
grep -q '"msg"' "$work/logs/job.log" && ! grep -q 'Read-only file system\|Permission denied' "$work/logs/job.log" &&
  pass "pod: JSON logs as configured; no 'Read-only file system' or 'Permission denied' in them" ||
  fail "pod: log format or a write outside /tmp: $(grep -m2 'Read-only\|Permission denied' "$work/logs/job.log")"

agent_job "$work/logs/stop.log" -- /opt/tdist/bin/train --steps 100000000 --print-every 0
if wait_for 'started 2 worker' "$work/logs/stop.log" 20; then
  probes=""
  for p in healthz readyz; do
    code="$(nsenter --target "$APID" --net curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:29600/$p")"
    probes+="/$p $code "
  done
  [ "$probes" = "/healthz 200 /readyz 200 " ] && pass "pod: the probes' port 29600 answers ${probes% }" ||
    fail "pod: probes on port 29600: $probes"
  t1=$(date +%s)
  kill -TERM "$APID"
  wait_job 40
  [ "$RC" = 143 ] && pass "pod: SIGTERM to PID 1 (docker stop / kubelet) stops the job: exit 143 in $(( $(date +%s) - t1 ))s" ||
    { fail "pod: SIGTERM to PID 1: exit $RC (want 143)"; sed 's/^/    | /' "$work/logs/stop.log" | tail -8; }
else
  fail "pod: long job did not start its workers"; sed 's/^/    | /' "$work/logs/stop.log" | tail -10
  kill -KILL "$APID" "$JPID" 2>/dev/null; wait "$JPID" 2>/dev/null
fi

# ---- 6. the gpu stage (its base image cannot run here) ---------------------------------------
G="$work/gpu-root"
if copy_from_build gpu "$G"; then
  if [ "$DESTS" = "$dests" ] && diff -r "$R" "$G" >/dev/null; then pass "gpu: the same files as cpu: ${DESTS% }"
  else fail "gpu: COPY lines differ from the cpu stage's ($DESTS vs $dests)"; fi
fi
gpkgs=" $(rec run gpu | while IFS= read -r c; do is_apt "$c" && "$PY" "$TOOL" apt-packages "$c"; done | tr '\n' ' ') "
gmissing=""
for p in $list_pkgs; do [[ "$gpkgs" == *" $p "* || "$gpkgs" == *" ${p}t64 "* ]] || gmissing+="$p "; done
[ -z "$gmissing" ] && pass "gpu: installs the Ubuntu 24.04 names of the cpu stage's packages:${gpkgs% }" ||
  fail "gpu: lacks (the Ubuntu name of) ${gmissing% }"
before=$nfail
check_settings gpu
[ "$nfail" = "$before" ] && pass "gpu: same USER, EXPOSE, STOPSIGNAL, ENTRYPOINT; labels"
rec run gpu | grep -q 'libcudart.so.13' && rec run gpu | grep -q 'libnccl.so.2' &&
  note "gpu: the loader checks for libcudart.so.13 and libnccl.so.2 run only in a real docker build" ||
  fail "gpu: no RUN checks that libcudart.so.13 and libnccl.so.2 are loadable"

finish
