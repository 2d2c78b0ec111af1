"""Why user namespaces cannot be made here, and what to do: the daemonless engines' (bubblewrap, NsJail) most
common refusal, told apart by what switched them off.

- the sysctls that switch them off for everyone (`kernel.unprivileged_userns_clone`, `user.max_user_namespaces`);
- AppArmor's restriction (`kernel.apparmor_restrict_unprivileged_userns=1`, Ubuntu 23.10 and later): an
  unconfined binary, a bundled bwrap included, gets none, or gets one without the capabilities to set it up;
- the server itself running confined (in a user namespace, under a seccomp filter, with no_new_privs): a
  container, or an MCP client's own sandbox, which also hides the container engines' sockets.

Reads /proc only, imports nothing Linux-only: `outer_sandbox` is asked on every platform (it finds nothing off
Linux). docs/platforms-linux.md holds the long form of each fix.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llm_sandbox_mcp.errors import BackendUnavailable

PROC = Path("/proc")
DOCS = "docs/platforms-linux.md"
# What bwrap and nsjail print when a user namespace could not be made (bwrap: "No permissions to create new
# namespace", "setting up uid map: Permission denied", "...max_user_namespaces exceeded (ENOSPC)"; nsjail:
# "clone(flags=...CLONE_NEWUSER...) failed: Operation not permitted").
_REFUSED = re.compile(
    r"No permissions to creat|setting up uid map|uid_map|Creating new namespace failed|CLONE_NEWUSER[^\n]*failed"
)
_APPARMOR_PROFILE = (
    "printf 'abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile llm-sandbox-{name} {path} flags=(unconfined) "
    "{{\\n  userns,\\n}}\\n' | sudo tee /etc/apparmor.d/llm-sandbox-{name} && "
    "sudo apparmor_parser -r /etc/apparmor.d/llm-sandbox-{name}"
)
# The container engines' sockets where they are found without configuration (Docker, rootful and rootless
# Podman, Docker Desktop on Linux).
_ENGINE_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock")
_USER_SOCKETS = ("podman/podman.sock", "docker.sock")
OUTSIDE_FIX = (
    'start the server outside that sandbox (VS Code: `"sandboxEnabled": false` on this server in mcp.json; '
    "Codex: its command without the `codex sandbox … --` wrapper; sandbox-runtime: not under `srt`), or let the "
    "sandbox reach a container engine's socket (allow /var/run/docker.sock or the Podman socket, and set "
    "DOCKER_HOST to it)"
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def sysctl_problem(proc: Path | None = None) -> str | None:
    """The sysctl that switches user namespaces off for every unprivileged process, as `name = value`."""
    proc = proc or PROC
    for relative in ("sys/kernel/unprivileged_userns_clone", "sys/user/max_user_namespaces"):
        if _read(proc / relative) == "0":
            return f"{relative[4:].replace('/', '.')} = 0"
    return None


def confinement(proc: Path | None = None) -> list[str]:
    """How this process is itself confined, as a container or a client's sandbox confines it: [] when it is not."""
    proc = proc or PROC
    signs: list[str] = []
    uid_map = _read(proc / "self/uid_map")
    if uid_map is not None and uid_map.split() != ["0", "0", "4294967295"]:
        signs.append("in a user namespace")
    status = dict(line.split(":", 1) for line in (_read(proc / "self/status") or "").splitlines() if ":" in line)
    if status.get("Seccomp", "").strip() == "2":
        signs.append("under a seccomp filter")
    if status.get("NoNewPrivs", "").strip() == "1":
        signs.append("with no_new_privs")
    return signs


def refused(output: str) -> bool:
    """Whether a jail's error output says it could not make a user namespace."""
    return _REFUSED.search(output) is not None


def _errno_of(output: str) -> str:
    if "setting up uid map" in output or "uid_map" in output:
        return "the namespace was made without the capabilities to set it up (uid map: permission denied)"
    if "ENOSPC" in output or "No space left" in output or "max_user_namespaces" in output:
        return "ENOSPC: no more user namespaces may be made here (the count or nesting limit)"
    if "not support user namespaces" in output or "Invalid argument" in output:
        return "EINVAL: this kernel has no user namespaces"
    if "Permission denied" in output:
        return "EACCES: the kernel refused them"
    return "EPERM: the kernel refused them"


def diagnosis(jail: Path | None, proc: Path | None = None) -> tuple[str, str]:
    """(the likely cause, the fix) of refused user namespaces, from what this host and process show."""
    proc = proc or PROC
    signs = confinement(proc)
    if signs:
        return (
            f"the server itself runs inside another sandbox or container ({', '.join(signs)}) that refuses new "
            "user namespaces: an MCP client's sandbox (VS Code's `sandboxEnabled`, `codex sandbox`, "
            "sandbox-runtime) or a container",
            OUTSIDE_FIX,
        )
    problem = sysctl_problem(proc)
    if problem is not None:
        name = problem.split(" ")[0]
        value = "28633" if name == "user.max_user_namespaces" else "1"
        return (
            f"the sysctl {problem} switches them off for every unprivileged process",
            f"`sudo sysctl -w {name}={value}` (persist it in /etc/sysctl.d/)",
        )
    name = jail.name if jail is not None else "bwrap"
    path = str(jail) if jail is not None else "/usr/bin/bwrap"
    profile = _APPARMOR_PROFILE.format(name=name, path=path)
    if _read(proc / "sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, "
            f"Ubuntu 23.10 and later) and {path} has no AppArmor profile that allows them",
            f"give it one: `{profile}`; or switch the restriction off for every program: `sudo sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0`",
        )
    return (
        f"the sysctls allow them, so a security policy on {path} refuses them: AppArmor's user-namespace "
        "restriction (Ubuntu 23.10 and later), an SELinux policy, or a seccomp filter",
        f"find it in the kernel log (`journalctl -k | grep -i -e apparmor -e userns`); for AppArmor, a profile "
        f"allows it: `{profile}`",
    )


def userns_refused(backend: str, jail: Path | None, observed: str, proc: Path | None = None) -> BackendUnavailable:
    """The refusal of a daemonless backend whose jail could not make a user namespace: cause and fix."""
    cause, fix = diagnosis(jail, proc)
    said = " ".join(observed.split())[:300]
    return BackendUnavailable(
        f"BACKEND={backend} cannot create the user namespaces its sandboxes are made of ({_errno_of(observed)}; "
        f"it said: {said}). Likely cause: {cause}. Fix: {fix}; or use BACKEND=docker or BACKEND=podman. "
        f"See {DOCS}."
    )


def _visible_sockets() -> list[str]:
    candidates: list[str] = list(_ENGINE_SOCKETS)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        candidates += [f"{runtime}/{name}" for name in _USER_SOCKETS]
    home = os.environ.get("HOME")
    if home:
        candidates.append(f"{home}/.docker/run/docker.sock")
    for variable in ("DOCKER_HOST", "PODMAN_HOST", "CONTAINER_HOST"):
        value = os.environ.get(variable, "")
        if value.startswith("unix://"):
            candidates.append(value[len("unix://") :])
    return [path for path in candidates if os.path.exists(path)]


def outer_sandbox(proc: Path | None = None) -> str | None:
    """When no engine can run and the server looks confined with no engine socket in sight: the likely reason."""
    signs = confinement(proc)
    if not signs or _visible_sockets():
        return None
    return (
        f"The server appears to run inside a sandbox ({', '.join(signs)}) that hides the container engines' "
        "sockets (none of /var/run/docker.sock, /run/podman/podman.sock or the user's Podman socket is visible) "
        "and refuses user namespaces, as an MCP client's own sandbox does (VS Code's `sandboxEnabled`, "
        f"`codex sandbox`, sandbox-runtime). Fix: {OUTSIDE_FIX}. See {DOCS}."
    )
