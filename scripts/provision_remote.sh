# Sourced by provision.sh: a current Docker (26+) and Podman (5) whose filesystem the server cannot see, for the
# tests of the topologies users have (Docker Desktop's VM, Colima, Podman machine, a remote DOCKER_HOST).
# Debian 13's engines are installed into a root filesystem of their own (a copy of the trixie base image), and
# each engine runs from it in a mount namespace of its own: pivot_root into that root filesystem, with private
# /tmp, /root, /home and /run, its own data root, exec root and pidfile. Only the directory holding the two
# sockets is shared with the host. The main engines are never touched: the images are read from them.
#
#   step_remote_engines          the root filesystem (cached), both engines started (or restarted when they
#                                died), the stand-in images copied in (when the main engine's differ)
#   step_remote_project_images   (--cli) the project images `images list` names, copied in the same way
REMOTE_HOME=/var/lib/llm-sandbox-mcp-remote
REMOTE_ROOTFS=$REMOTE_HOME/rootfs
REMOTE_RUN=/run/llm-sandbox-remote           # shared with the engines: their sockets, nothing else
REMOTE_STATE=/run/llm-sandbox-mcp-remote     # the host's notes: pid and mount namespace of each engine
REMOTE_SUITE=trixie
REMOTE_PACKAGES=(docker.io podman containerd runc)

remote_containers_conf() {
  cat <<'EOF'
# Written by llm-sandbox-mcp scripts/provision_remote.sh (see containers_conf in provision.sh for why).
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
}

remote_recipe() { # what the root filesystem depends on, hashed
  { printf '%s\n' "$BASE_ID" "${REMOTE_PACKAGES[*]}"; remote_containers_conf; } | sha256sum | cut -d' ' -f1
}

remote_start_recipe() { # remote_start_recipe ENGINE: how the engine is started, hashed
  { printf '%s\n' "$REMOTE_NAMESPACE"; remote_command "$1"; } | sha256sum | cut -d' ' -f1
}

remote_sock() { printf '%s/%s.sock\n' "$REMOTE_RUN" "$1"; }

remote_up() { # remote_up docker|podman: the engine answers on its socket
  curl -fsS --max-time 5 --unix-socket "$(remote_sock "$1")" http://d/_ping >/dev/null 2>&1
}

remote_pid() { # print the pid of the engine this script started, if it still runs
  local pid=""
  if [[ -r $REMOTE_STATE/$1.pid ]]; then pid=$(<"$REMOTE_STATE/$1.pid"); fi
  # Its command line names its socket: a pid reused by another process does not.
  if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "unix://$(remote_sock "$1")"; then
    printf '%s\n' "$pid"
  fi
}

remote_kill_leftovers() { # remote_kill_leftovers ENGINE: end what is left in a dead engine's mount namespace
  local ns="" proc root
  if [[ -r $REMOTE_STATE/$1.mntns ]]; then ns=$(<"$REMOTE_STATE/$1.mntns"); fi
  [[ -n $ns ]] || return 0
  root=$(stat -c '%d:%i' "$REMOTE_ROOTFS")
  # Its containerd (Docker's) or conmon processes would hold the data root's locks against a new engine. The
  # kernel reuses a freed namespace's number, so a process must also have the engines' root filesystem as its /.
  for proc in /proc/[0-9]*; do
    if [[ $(readlink "$proc/ns/mnt" 2>/dev/null) == "$ns" && $(stat -L -c '%d:%i' "$proc/root" 2>/dev/null) == "$root" ]]; then
      kill -9 "${proc#/proc/}" 2>/dev/null || true
    fi
  done
  rm -f "$REMOTE_STATE/$1.mntns" "$REMOTE_STATE/$1.pid" "$REMOTE_STATE/$1.recipe"
}

# Run by `unshare -m` as "sh -c SCRIPT sh ROOTFS SHARED COMMAND...": the engine's own view of the machine. Its
# own /dev/shm too: Podman keeps its lock table there (libpod_lock), which the main Podman service must not share.
# shellcheck disable=SC2016 # expanded by that sh
REMOTE_NAMESPACE='set -e
root=$1 shared=$2
shift 2
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
for dir in root home run; do mount -t tmpfs -o mode=0755 tmpfs "$root/$dir"; done
mkdir -p "$root$shared" "$root/.host"
mount --bind "$shared" "$root$shared"
cd "$root"
pivot_root . .host
cd /
umount -l /.host
rmdir /.host
exec "$@"'

remote_command() { # remote_command docker|podman: the engine's command line inside its namespace
  case $1 in
    docker) printf '%s\n' /usr/sbin/dockerd -H "unix://$(remote_sock docker)" --data-root /var/lib/docker \
      --exec-root /run/docker --pidfile /run/docker.pid --iptables=false --ip6tables=false --bridge=none \
      --cgroup-parent=llm-sandbox-remote-docker --group root ;;
    podman) printf '%s\n' /usr/bin/podman system service --time=0 "unix://$(remote_sock podman)" ;;
  esac
}

start_remote() { # start_remote docker|podman
  local engine=$1 t0=$EPOCHREALTIME pid command done=started
  pid=$(remote_pid "$engine")
  if [[ -z $pid ]]; then
    remote_kill_leftovers "$engine"
    rm -f "$(remote_sock "$engine")"
    mapfile -t command < <(remote_command "$engine")
    spawn_detached "$LOGDIR/remote-$engine.log" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      PODMAN_IGNORE_CGROUPSV1_WARNING=1 unshare -m --propagation private \
      sh -c "$REMOTE_NAMESPACE" sh "$REMOTE_ROOTFS" "$REMOTE_RUN" "${command[@]}"
    pid=$!
    printf '%s\n' "$pid" >"$REMOTE_STATE/$engine.pid"
    remote_start_recipe "$engine" >"$REMOTE_STATE/$engine.recipe"
  else
    say "remote: $engine (pid $pid) is running but not answering yet; waiting"
    done=waited for
  fi
  wait_for 60 remote_up "$engine" || die "the current $engine engine did not answer on $(remote_sock "$engine")" \
    "$LOGDIR/remote-$engine.log"
  # Noted once it answers: the namespace read right after the start was not always the one Podman ends up in.
  readlink "/proc/$pid/ns/mnt" >"$REMOTE_STATE/$engine.mntns"
  say "remote: $done $engine $(remote_version "$engine") on $(remote_sock "$engine") ($(elapsed "$t0"))"
}

remote_version() { # remote_version docker|podman
  curl -fsS --max-time 5 --unix-socket "$(remote_sock "$1")" http://d/version 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get("Version", "?"))' 2>/dev/null || echo "?"
}

remote_in_rootfs() { # remote_in_rootfs LOG WHAT COMMAND...: COMMAND chrooted in the new root filesystem, with /proc
  local log=$1 what=$2
  shift 2
  logged "$log" "$what" unshare -m --propagation private \
    sh -c 'mount -t proc proc "$1/proc" && root=$1 && shift && exec chroot "$root" "$@"' sh "$REMOTE_ROOTFS.new" "$@"
}

build_remote_rootfs() {
  local t0=$EPOCHREALTIME new=$REMOTE_ROOTFS.new log="$LOGDIR/remote-rootfs.log" container
  : >"$log"
  remove_rootfs "$new"
  mkdir -p "$new"
  container=$(docker create "$BASE" true) || die "docker create $BASE"
  docker export "$container" | tar --numeric-owner -C "$new" -x || {
    docker rm "$container" >/dev/null
    die "copying $BASE into $new"
  }
  docker rm "$container" >>"$log"
  cp /etc/resolv.conf "$new/etc/resolv.conf"
  # No init system there: the maintainer scripts must not start the engines.
  printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"
  chmod 755 "$new/usr/sbin/policy-rc.d"
  remote_in_rootfs "$log" "apt-get update in the $REMOTE_SUITE root filesystem" apt-get "${APT_OPTIONS[@]}" update
  remote_in_rootfs "$log" "apt-get install ${REMOTE_PACKAGES[*]} in the $REMOTE_SUITE root filesystem" \
    apt-get "${APT_OPTIONS[@]}" install --no-install-recommends "${REMOTE_PACKAGES[@]}"
  rm -rf "$new"/var/lib/apt/lists/* "$new"/var/cache/apt/archives/*.deb
  mkdir -p "$new/etc/containers"
  remote_containers_conf >"$new/etc/containers/containers.conf"
  remote_recipe >"$new/.llm-sandbox-mcp-recipe"
  remove_rootfs "$REMOTE_ROOTFS"
  mv "$new" "$REMOTE_ROOTFS"
  say "remote: installed $(chroot "$REMOTE_ROOTFS" dpkg-query -W -f='${Package} ${Version}  ' docker.io podman)into" \
    "$REMOTE_ROOTFS ($(elapsed "$t0"))"
}

stop_remote() { # stop_remote ENGINE: before its root filesystem is replaced
  local pid
  pid=$(remote_pid "$1")
  if [[ -n $pid ]]; then
    kill "$pid"
    wait_for 20 pid_gone "$pid" || true
  fi
  remote_kill_leftovers "$1"
}

copy_to_remote() { # copy_to_remote docker|podman IMAGE...: the main engine's images the remote one lacks
  local engine=$1 t0=$EPOCHREALTIME log="$LOGDIR/remote-copy-$1.log" image want have missing=() remote=()
  shift
  : >"$log"
  case $engine in
    docker) remote=(env "DOCKER_HOST=unix://$(remote_sock docker)" docker) ;;
    podman) remote=(podman --url "unix://$(remote_sock podman)") ;;
  esac
  for image in "$@"; do
    want=$("$engine" image inspect --format '{{.Id}}' "$image" 2>>"$log") || die "the main $engine engine has no $image" "$log"
    have=$("${remote[@]}" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    if [[ ${want#sha256:} != "${have#sha256:}" ]]; then missing+=("$image"); fi
  done
  if ((${#missing[@]} == 0)); then
    say "remote: $engine: all ${#} images present"
    return
  fi
  # One archive for all: the images share their layers (stand-ins on one base, project images on the stand-ins).
  if [[ $engine == docker ]]; then
    docker save "${missing[@]}" 2>>"$log" | logged "$log" "loading images into the current docker" "${remote[@]}" load
  else
    podman save -m --format docker-archive "${missing[@]}" 2>>"$log" |
      logged "$log" "loading images into the current podman" "${remote[@]}" load
  fi
  say "remote: $engine: copied ${missing[*]} ($(elapsed "$t0"))"
}

step_remote_engines() {
  local engine
  [[ $BASE == *:"$REMOTE_SUITE" ]] ||
    die "the current engines need the $REMOTE_SUITE base; provisioning made $BASE (PROVISION_SUITES=$SUITES)"
  mkdir -p "$REMOTE_HOME" "$REMOTE_RUN" "$REMOTE_STATE"
  chmod 700 "$REMOTE_HOME"
  if [[ ! -r $REMOTE_ROOTFS/.llm-sandbox-mcp-recipe || $(<"$REMOTE_ROOTFS/.llm-sandbox-mcp-recipe") != "$(remote_recipe)" ]]; then
    for engine in docker podman; do stop_remote "$engine"; done
    build_remote_rootfs
  fi
  for engine in docker podman; do
    if [[ -n $(remote_pid "$engine") && $(cat "$REMOTE_STATE/$engine.recipe" 2>/dev/null) != "$(remote_start_recipe "$engine")" ]]; then
      say "remote: restarting $engine: how it is started has changed"
      stop_remote "$engine"
    fi
    if remote_up "$engine"; then
      say "remote: $engine $(remote_version "$engine") answering on $(remote_sock "$engine")"
    else
      start_remote "$engine"
    fi
  done
  local images=() lang
  for lang in "${LANGUAGES[@]}"; do images+=("${IMAGE[$lang]}"); done
  copy_to_remote docker "${images[@]}" &
  local docker_job=$!
  copy_to_remote podman "${images[@]}"
  wait "$docker_job" || exit 1
}

remote_project_tags() { # remote_project_tags ENGINE ENV...: the project images `images list` names on ENGINE
  local engine=$1
  shift
  env "$@" BACKEND="$engine" "$CLI" images list "${LANGUAGES[@]/#/--language=}" 2>>"$LOGDIR/remote-project-images.log" |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^localhost\/llm-sandbox-mcp-/) print $i }'
}

step_remote_project_images() { # the project images built on the main engines, copied
  local engine env=() tags lang job jobs=()
  [[ -n $CLI ]] || return 0
  for lang in "${LANGUAGES[@]}"; do env+=("SANDBOX_IMAGE_${lang^^}=${IMAGE[$lang]}"); done
  for engine in docker podman; do
    mapfile -t tags < <(remote_project_tags "$engine" "${env[@]}")
    ((${#tags[@]} == ${#LANGUAGES[@]})) ||
      die "$CLI images list named ${#tags[@]} project images on $engine" "$LOGDIR/remote-project-images.log"
    copy_to_remote "$engine" "${tags[@]}" &
    jobs+=($!)
  done
  for job in "${jobs[@]}"; do wait "$job" || exit 1; done
}
