"""The server runs on macOS and Windows with Docker, Podman and Kubernetes: no module on those paths may import a
POSIX-only (or Windows-only) module, or call a POSIX-only function, unless a platform test guards it.

Which modules: every module of the package except
- `runners/`: the code that runs inside the sandboxes (always Linux), never imported by the server;
- `backends/_bubblewrap/`, `backends/_nsjail/` and what they share, `backends/_daemonless/`: the daemonless engines,
  built from Linux namespaces, which `backends._backend_module` refuses off Linux before importing them.
Everything else (the CLI, the MCP server, the run core, the container and Kubernetes engines, egress) can be
imported or run on a Mac or a Windows laptop, so it is checked whole, imports inside functions included (they
run too), and it may not reach into the excluded folders except under a platform guard.

Why a static check: hiding `fcntl` from a Linux interpreter does not make it Windows (the MCP SDK itself picks
its imports by `sys.platform`), and the real machines are the `platforms` workflow's. A guard is an `if`,
conditional expression or `and`/`or` whose test reads `sys.platform`, `os.name` or `hasattr(...)`, around the
use or ending its block before it (`if sys.platform == "win32": return ...`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import llm_sandbox_mcp

PACKAGE = Path(llm_sandbox_mcp.__file__).parent
EXCLUDED = ("runners", "backends/_bubblewrap", "backends/_nsjail", "backends/_daemonless")
EXCLUDED_MODULES = tuple("llm_sandbox_mcp." + folder.replace("/", ".") for folder in EXCLUDED)

# Modules that exist on one family of systems only.
PLATFORM_MODULES = {
    "fcntl", "resource", "termios", "pwd", "grp", "pty", "tty", "posix", "syslog", "crypt", "spwd", "nis",
    "readline", "curses", "_posixsubprocess", "msvcrt", "winreg", "_winapi", "winsound",
}  # fmt: skip
# Names that are missing on Windows (os, signal, socket, select): AttributeError at run time.
POSIX_ONLY = {
    "os": {
        "geteuid", "getuid", "getegid", "getgid", "getgroups", "setuid", "setgid", "seteuid", "setegid",
        "getpgid", "getpgrp", "setsid", "setpgid", "killpg", "fork", "forkpty", "wait3", "wait4", "WNOHANG",
        "fchmod", "fchown", "lchown", "chown", "chroot", "mkfifo", "mknod", "getloadavg", "sched_getaffinity",
        "sysconf", "pathconf", "statvfs", "uname", "openpty", "pipe2", "posix_spawn", "register_at_fork",
        "O_NOFOLLOW", "O_NONBLOCK", "O_CLOEXEC", "O_DIRECTORY",
    },
    "signal": {
        "SIGHUP", "SIGKILL", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM", "SIGSTOP", "SIGCONT",
        "SIGPIPE", "SIGXCPU", "SIGTSTP", "SIGWINCH", "pthread_kill", "setitimer", "alarm", "pause", "sigwait",
    },
    "socket": {"AF_UNIX", "SOCK_SEQPACKET", "SO_PEERCRED", "SCM_RIGHTS", "send_fds", "recv_fds", "sethostname"},
    "select": {"poll", "epoll"},
    "asyncio": {"start_unix_server", "open_unix_connection"},
    "anyio": {"connect_unix", "create_unix_listener"},
}  # fmt: skip

# Uses in checked modules that only a Linux-only engine reaches at run time, and what makes that so.
LINUX_ENGINES_ONLY = {
    "llm_sandbox_mcp/run/zygote/templates.py": (
        {"socket.AF_UNIX", "socket.SOCK_SEQPACKET", "socket.send_fds"},
        "zygote templates run on bubblewrap only: `ZygoteTemplates._host` is None unless the backend is a TemplateHost",
    ),
}


@dataclass(frozen=True)
class Finding:
    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


def checked_modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not any(path.relative_to(PACKAGE).as_posix().startswith(folder + "/") for folder in EXCLUDED)
    )


def _reads_platform(test: ast.AST) -> bool:
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in (("sys", "platform"), ("os", "name"))
        ):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
            return True
    return False


def _ends_block(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


class _Guards:
    """Which nodes of a module are under a platform guard."""

    def __init__(self, tree: ast.Module) -> None:
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent

    def guarded(self, node: ast.AST) -> bool:
        current = node
        while current in self.parents:
            parent = self.parents[current]
            if isinstance(parent, (ast.If, ast.IfExp)) and _reads_platform(parent.test):
                return True
            if isinstance(parent, ast.BoolOp) and any(_reads_platform(value) for value in parent.values):
                return True
            for field in ("body", "orelse", "finalbody"):
                block: object = getattr(parent, field, None)
                if isinstance(block, list) and current in block:
                    statements = cast(list[ast.stmt], block)
                    for statement in statements[: statements.index(cast(ast.stmt, current))]:
                        if (
                            isinstance(statement, ast.If)
                            and _reads_platform(statement.test)
                            and (_ends_block(statement.body) or _ends_block(statement.orelse))
                        ):
                            return True
            current = parent
        return False


def findings(source: str, module: str) -> Iterator[Finding]:
    tree = ast.parse(source, filename=module)
    guards = _Guards(tree)
    for node in ast.walk(tree):
        imported: list[str] = []
        line: int = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in imported:
            if name.split(".")[0] in PLATFORM_MODULES and not guards.guarded(node):
                yield Finding(module, line, f"imports {name}, which one family of systems lacks")
            if name.startswith(EXCLUDED_MODULES) and not guards.guarded(node):
                yield Finding(module, line, f"imports {name}, from the Linux-only folders")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            excused, _ = LINUX_ENGINES_ONLY.get(module, (set[str](), ""))
            name = f"{node.value.id}.{node.attr}"
            if node.attr in POSIX_ONLY.get(node.value.id, ()) and name not in excused and not guards.guarded(node):
                yield Finding(module, line, f"uses {node.value.id}.{node.attr}, which Windows lacks")


def all_findings() -> list[str]:
    return [
        str(finding)
        for path in checked_modules()
        for finding in findings(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE.parent).as_posix())
    ]


def test_no_module_on_the_container_and_kubernetes_paths_needs_linux_unguarded() -> None:
    assert all_findings() == []


def test_the_check_sees_what_it_must_and_accepts_the_guards_it_claims() -> None:
    """The check itself: each way of hiding a POSIX-only use is found; each guard form is accepted."""
    source = """
import fcntl
import os, sys
from llm_sandbox_mcp.backends._bubblewrap.seccomp import FILTER

def f():
    import resource
    return os.geteuid(), signal.SIGHUP

if sys.platform == "win32":
    import msvcrt
else:
    import termios

def g():
    if sys.platform == "win32":
        return None
    return os.getuid()

uid = None if os.name == "nt" else os.getuid()
other = sys.platform != "win32" and os.getegid()
"""
    found = sorted((finding.line, finding.what.split(",")[0]) for finding in findings(source, "probe.py"))
    assert found == [
        (2, "imports fcntl"),
        (4, "imports llm_sandbox_mcp.backends._bubblewrap.seccomp"),
        (4, "imports llm_sandbox_mcp.backends._bubblewrap.seccomp.FILTER"),
        (7, "imports resource"),
        (8, "uses os.geteuid"),
        (8, "uses signal.SIGHUP"),
    ]
    assert checked_modules(), "the package's modules were not found"
    names = {path.relative_to(PACKAGE).as_posix() for path in checked_modules()}
    assert {"cli.py", "cache_index.py", "backends/_docker.py", "backends/_podman/service.py"} <= names
    assert not any(name.startswith(("runners/", "backends/_bubblewrap/")) for name in names)
