"""Command lines for the bubblewrap backend: a sandbox's holder, the per-exec bwrap inside it, and the killer.

A sandbox is a long-lived *holder*: a bwrap whose namespaces (user, mount, network, IPC, UTS, PID) hold the
size-limited tmpfs workspace and /tmp, with an idle shell as PID 1. Every exec enters those namespaces with
`nsenter` and runs a second bwrap there, which adds seccomp, no capabilities, a cleared environment, a private
/dev and no way to make further user namespaces. Execs share files and PIDs, as in a container: a process
one exec starts can be signalled by the next, and outlives the exec that started it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from llm_sandbox_mcp.backends._bubblewrap.host import Bwrap
from llm_sandbox_mcp.backends._daemonless.argv import (
    DEVICES,
    GATE,
    HOLDER_COMMAND,
    ROOT_DIRS,
    SANDBOX_PATH,
    host_sources,
    nsenter_argv,
)
from llm_sandbox_mcp.models import WORKDIR, Limits, SandboxSpec
from llm_sandbox_mcp.proc_masks import PROC_MASKED


def system_root() -> list[str]:
    """/usr read-only, and /bin, /lib... as the host has them: links into /usr (merged /usr) or directories."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for name in ROOT_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    return argv


def probe_argv(bwrap: Bwrap, uid: int, gid: int) -> list[str]:
    return [str(bwrap.path), "--unshare-all", "--uid", str(uid), "--gid", str(gid), *system_root(), "--", "true"]


def holder_argv(
    bwrap: Bwrap, spec: SandboxSpec, *, info_fd: int, file_fds: Mapping[str, int], cache_dir: Path | None
) -> list[str]:
    limits = spec.limits
    share_net = limits.network_mode == "host"
    argv = [str(bwrap.path), "--unshare-all"]
    if share_net:
        argv.append("--share-net")
    argv += [
        "--die-with-parent", "--new-session", "--as-pid-1", "--info-fd", str(info_fd),
        "--uid", str(limits.uid), "--gid", str(limits.gid), "--hostname", "sandbox", *system_root(),
    ]  # fmt: skip
    for source in host_sources(share_net):
        argv += ["--ro-bind-try", source, source]
    for dest, fd in file_fds.items():
        argv += ["--perms", "0644", "--file", str(fd), dest]
    argv += ["--proc", "/proc"]
    if not spec.forks:  # a zygote template's children mount a /proc of their own, which masks would forbid
        argv += _proc_masks()
    # Device nodes for the per-exec bwrap's --dev; without devpts here the holder needs one user namespace only.
    for name in DEVICES:
        argv += ["--dev-bind-try", f"/dev/{name}", f"/dev/{name}"]
    argv += ["--perms", "0700", "--size", str(limits.workspace_bytes), "--tmpfs", str(WORKDIR)]
    argv += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    # bwrap's scratch mount point, made here so the per-exec bwrap does not litter the sandbox's /tmp.
    argv += ["--dir", f"/run/user/{limits.uid}/.bubblewrap"]
    for source, dest in bwrap.binds:
        argv += ["--ro-bind", str(source), dest]
    if spec.cache is not None and cache_dir is not None:
        argv += ["--bind" if spec.cache.writable else "--ro-bind", str(cache_dir), str(spec.cache.target)]
    argv += ["--remount-ro", "/", "--chdir", "/", "--", *HOLDER_COMMAND]
    return argv


def _proc_masks() -> list[str]:
    """What the container engines hide of /proc, hidden in the holder's: files behind /dev/null, directories
    behind an empty read-only tmpfs (the paths this kernel has)."""
    argv: list[str] = []
    for path in map(Path, PROC_MASKED):
        if path.is_dir():
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", str(path), "--remount-ro", str(path)]
        elif path.exists():
            argv += ["--ro-bind", "/dev/null", str(path)]
    return argv


def exec_argv(
    bwrap: Bwrap,
    nsenter: str,
    holder_pid: int,
    limits: Limits,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: PurePosixPath,
    seccomp_fd: int,
    as_root: bool = False,
    template: bool = False,
) -> list[str]:
    """sh (the gate) -> nsenter into the holder -> bwrap (hardening) -> argv.

    `template`: a zygote's template process (see `zygote`), which may make one user namespace per child,
    so bwrap does not disable them (its seccomp filter, `TEMPLATE_FILTER`, lets unshare and mount through).

    As root the gate runs as root (so the server may set its rlimits without CAP_SYS_RESOURCE, which containers
    often lack), and nsenter becomes the sandbox user only inside the holder's user namespace: there
    RLIMIT_NPROC counts the sandbox's processes, not every process of that uid on the host.
    """
    inner = [
        bwrap.inner_path, "--unshare-user", "--unshare-cgroup-try", *([] if template else ["--disable-userns"]),
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--uid", str(limits.uid), "--gid", str(limits.gid),
        "--bind", "/", "/", "--dev", "/dev",
        "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        # Hides the holder's helpers (bwrap's scratch dir, a bundled bwrap).
        "--perms", "0755", "--size", "4096", "--tmpfs", "/run", "--remount-ro", "/run",
        "--clearenv",
    ]  # fmt: skip
    for key, value in {"PATH": SANDBOX_PATH, **env}.items():
        inner += ["--setenv", key, value]
    inner += ["--chdir", str(workdir), "--seccomp", str(seccomp_fd), "--", *argv]
    return ["/bin/sh", "-c", GATE, "sh", *nsenter_argv(nsenter, holder_pid, limits, as_root), *inner]
