"""Command lines that start a program as users run it on Linux hosts unlike CI's: as an ordinary user, inside an
MCP client's own sandbox, or with a jail binary that is refused user namespaces (as AppArmor refuses them).

They need root (CI runs as root): a private mount namespace, a uid switch, seccomp without no_new_privs.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

NOBODY = 65534
REFUSED = Path(__file__).with_name("userns_refused.py")


def _hidden_root(path: Path) -> Path | None:
    """The first directory above `path` that other users cannot enter (root's home, most often)."""
    for ancestor in reversed(path.parents):
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor
    return None


def _interpreter_prefix(script: str) -> Path:
    """The installation a console script's interpreter lives in (a venv's base interpreter included)."""
    shebang = Path(script).read_text().splitlines()[0].removeprefix("#!").split()[0]
    interpreter = Path(shebang).resolve()
    return interpreter.parent.parent


def as_user(
    argv: Sequence[str], reach: Sequence[str | Path], uid: int = NOBODY, cgroups: Sequence[Path] = ()
) -> list[str]:
    """`argv` run as `uid` with no groups, in a private mount namespace where every path of `reach` can be
    entered: a directory such as root's home (where CI's interpreter lives) is replaced by a traversable tmpfs
    holding only those paths. It starts in `cgroups` (as a login session starts in its own). Nothing else of the
    host changes."""
    steps = [f"echo $$ > {directory}/cgroup.procs" for directory in cgroups]
    steps += ["mount --make-rprivate /", "mount -t tmpfs tmpfs /mnt"]
    hidden: dict[Path, set[str]] = {}
    for path in (Path(p).resolve() for p in reach):
        root = _hidden_root(path)
        if root is not None:
            hidden.setdefault(root, set()).add(path.relative_to(root).parts[0])
    for index, (root, names) in enumerate(sorted(hidden.items())):
        keep = f"/mnt/keep{index}"
        steps += [f"mkdir {keep}", f"mount --rbind {root} {keep}", f"mount -t tmpfs -o mode=755 tmpfs {root}"]
        for name in sorted(names):
            steps += [f"mkdir {root / name}", f"mount --rbind {keep}/{name} {root / name}"]
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    script = " && ".join(steps) + ' && exec "$@"'
    return ["unshare", "-m", "--", "sh", "-c", script, "sh", *setpriv, *argv]


def console_reach(script: str) -> list[str | Path]:
    """What a non-root user must reach to run the console script: the script's venv and its interpreter."""
    return [Path(script).resolve().parent.parent, _interpreter_prefix(script)]


def in_client_sandbox(argv: Sequence[str]) -> list[str]:
    """`argv` inside a sandbox like the ones MCP clients wrap stdio servers in (sandbox-runtime on Linux is
    bubblewrap): the host's files, but no /run (so no Docker or Podman socket), a private /tmp, and no further
    user namespaces (bwrap's --disable-userns). Run it as an unprivileged user (`as_user`), as clients run."""
    bwrap = shutil.which("bwrap") or "bwrap"
    return [
        bwrap, "--dev-bind", "/", "/", "--tmpfs", "/run", "--tmpfs", "/tmp", "--proc", "/proc",
        "--unshare-user", "--unshare-pid", "--disable-userns", "--die-with-parent", "--", *argv,
    ]  # fmt: skip


def refused_jail(binary: str, directory: Path) -> Path:
    """A wrapper that runs `binary` refused user namespaces, for SANDBOX_BWRAP_PATH or SANDBOX_NSJAIL_PATH: the
    refusal sits on that binary only, as AppArmor's does, and the server itself is not confined. `directory`
    must be readable by the sandbox user (the server runs bwrap as that user)."""
    python = shutil.which("python3", path="/usr/bin:/bin") or "python3"
    # One name and content every run: as root the server stages a copy by both, once.
    wrapper = directory / "refused" / "bin" / Path(binary).name
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nexec {python} {REFUSED} {binary} "$@"\n')
    for path in (directory, wrapper.parent.parent, wrapper.parent, wrapper):
        path.chmod(0o755)
    return wrapper
