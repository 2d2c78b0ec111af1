"""Command lines for the NsJail backend: a sandbox's holder, and the per-exec nsjail inside it.

The shape is bubblewrap's (see `_daemonless.argv`): a long-lived *holder* nsjail per sandbox owns its namespaces
(user, PID, mount, network, IPC, UTS, cgroup) and its size-limited tmpfs /workspace and /tmp, with an idle shell
as PID 1. Every exec enters those namespaces with `nsenter` and runs `nsjail -Me` there, which adds a nested user
namespace, a cgroup namespace, the seccomp policy (Kafel), no capabilities, no-new-privileges, a cleared
environment and a new session, then executes the command in place (no supervising process is left).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from llm_sandbox_mcp.backends._daemonless.argv import (
    DEVICES,
    GATE,
    HOLDER_COMMAND,
    ROOT_DIRS,
    SANDBOX_PATH,
    host_sources,
    nsenter_argv,
)
from llm_sandbox_mcp.backends._nsjail.host import Nsjail
from llm_sandbox_mcp.models import WORKDIR, Limits, SandboxSpec
from llm_sandbox_mcp.proc_masks import PROC_MASKED

# The holder's nsjail gets SIGTERM when the server dies (it then kills the jail: a PID 1 inside ignores it).
SETPRIV = "/usr/bin/setpriv"
ENV = "/usr/bin/env"  # nsjail executes a path; env looks the command up on the exec's PATH
_NO_NEW_NAMESPACES = (
    "--disable_clone_newns", "--disable_clone_newpid", "--disable_clone_newipc", "--disable_clone_newuts",
    "--disable_clone_newnet",
)  # fmt: skip


def _system_root() -> list[str]:
    argv = ["-R", "/usr"]
    for name in ROOT_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            argv += ["-s", f"{os.readlink(path)}:{path}"]
        elif path.is_dir():
            argv += ["-R", str(path)]
    return argv


def _ids(limits: Limits, as_root: bool) -> list[str]:
    """The sandbox uid and gid inside; outside the same ids as root, else this user (the only one it may map)."""
    outside_uid, outside_gid = (limits.uid, limits.gid) if as_root else (os.geteuid(), os.getegid())
    return ["-u", f"{limits.uid}:{outside_uid}:1", "-g", f"{limits.gid}:{outside_gid}:1"]


def probe_argv(nsjail: Nsjail, limits: Limits, as_root: bool) -> list[str]:
    # Not quiet (-Q): when it fails, its log says why.
    return [str(nsjail.path), "-Mo", *_ids(limits, as_root), *_system_root(), "--", "/bin/true"]


def holder_argv(
    nsjail: Nsjail, spec: SandboxSpec, *, files: Mapping[str, Path], cache_dir: Path | None, policy: str, as_root: bool
) -> list[str]:
    limits = spec.limits
    share_net = limits.network_mode == "host"
    argv = [SETPRIV, "--pdeathsig", "TERM", "--", str(nsjail.path), "-Mo", "-Q", "--time_limit", "0"]
    argv += ["--hostname", "sandbox", *_ids(limits, as_root)]
    if share_net:
        argv.append("--disable_clone_newnet")
    argv += _system_root()
    for source in host_sources(share_net):
        if os.path.exists(source):
            argv += ["-R", source]
    for dest, source in files.items():
        argv += ["-R", f"{source}:{dest}"]
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            argv += ["-B", f"/dev/{name}"]  # writable: /dev/null takes writes
    argv += ["-s", "/proc/self/fd:/dev/fd"]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        argv += ["-s", f"/proc/self/fd/{number}:/dev/{name}"]
    argv += ["-m", f"none:/dev/shm:tmpfs:size={limits.tmp_bytes},mode=1777"]
    argv += ["-m", f"none:{WORKDIR}:tmpfs:size={limits.workspace_bytes},mode=0700,uid={limits.uid},gid={limits.gid}"]
    argv += ["-m", f"none:/tmp:tmpfs:size={limits.tmp_bytes},mode=1777"]
    for source, dest in nsjail.binds:
        argv += ["-R", f"{source}:{dest}"]
    if spec.cache is not None and cache_dir is not None:
        argv += ["-B" if spec.cache.writable else "-R", f"{cache_dir}:{spec.cache.target}"]
    # procfs writable for the per-exec nsjail's uid map of its nested user namespace (as bwrap's --proc), mounted
    # here rather than by nsjail's own --proc so that what the container engines hide of it is hidden after it.
    argv += ["--disable_proc", "-m", "none:/proc:proc:rw"]
    if spec.forks:
        # A zygote template's children mount a /proc of their own, which masks here would forbid (the kernel
        # mounts procfs only where one is fully visible); each child masks its own again (`mask`). They also
        # mount a devpts instance of their own, as bubblewrap's children do: its mount point and ptmx link.
        argv += ["-m", "none:/dev/pts:devpts:newinstance,ptmxmode=0000,mode=0600", "-s", "pts/ptmx:/dev/ptmx"]
    else:
        argv += _proc_masks()
    argv += ["--cwd", "/", "--seccomp_string", policy, "--", *HOLDER_COMMAND]
    return argv


def _proc_masks() -> list[str]:
    """What the container engines hide of /proc: files behind /dev/null, directories behind an empty tmpfs (the
    paths this kernel has; a file only its owner may read, as /proc/timer_list, is out of the sandbox user's
    reach anyway, and nsjail could not open it to mount over it)."""
    argv: list[str] = []
    for path in PROC_MASKED:
        if os.path.isdir(path):
            argv += ["-m", f"none:{path}:tmpfs:size=4096,mode=0555"]
        elif os.path.exists(path) and os.stat(path).st_mode & stat.S_IROTH:
            argv += ["-R", f"/dev/null:{path}"]
    return argv


def exec_argv(
    nsjail: Nsjail,
    nsenter: str,
    holder_pid: int,
    limits: Limits,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: PurePosixPath,
    policy: str,
    as_root: bool,
    pass_fds: Sequence[int] = (),
) -> list[str]:
    """sh (the gate) -> nsenter into the holder -> nsjail -Me (hardening) -> argv. Rlimits come from the gate.

    nsjail closes every descriptor but 0, 1, 2 and `pass_fds` (a zygote template's control socket) before the
    command. A template's `policy` is `template_policy`: nsjail -Me never stops a nested user namespace, so the
    policy alone decides whether the command may make one."""
    inner = [nsjail.inner_path, "-Me", "-Q", *_NO_NEW_NAMESPACES, "--disable_proc", "--disable_rlimits"]
    for fd in pass_fds:
        inner += ["--pass_fd", str(fd)]
    inner += ["-u", f"{limits.uid}:{limits.uid}:1", "-g", f"{limits.gid}:{limits.gid}:1", "--nice_level", "0"]
    inner += ["--cwd", str(workdir)]
    for key, value in {"PATH": SANDBOX_PATH, **env}.items():
        inner += ["-E", f"{key}={value}"]
    command = list(argv) if argv and "/" in argv[0] else [ENV, "--", *argv]
    inner += ["--seccomp_string", policy, "--", *command]
    return ["/bin/sh", "-c", GATE, "sh", *nsenter_argv(nsenter, holder_pid, limits, as_root), *inner]
