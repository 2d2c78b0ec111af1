"""The in-sandbox runners as plain host processes, for the runner protocol's conformance test.

No engine and no image: the host's python3 and perl run the runners' sources as the server sends them, and
the server's own `Kernel` (and `Zygotes`) speak to them over pipes and sockets. Each runner starts as PID 1 of
a PID namespace of its own (util-linux `unshare`, with a user namespace so it needs no privilege), with a
private /proc and a fresh /tmp: the runners SIGKILL every process of their user that did not exist when they
started, which on the host would be the machine's; in there it is only theirs. Killing that PID 1 from outside
ends everything it started, as killing a sandbox does.

What stands in for an engine here: `kill_all` is a SIGKILL to that PID 1 (the server runs nothing else in a
runner's sandbox: an exec is an error here). A zygote child's own sandbox is made by runners/python_isolation.py
except its mounts (`STAND_IN_MOUNTS`): the host has no /workspace to mount a tmpfs on (and making one would change the
host), so the child makes a root of its own with one, as the engine would have. Namespaces, rlimits,
capabilities and the seccomp filter are the real ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import anyio
from anyio.abc import Process

from llm_sandbox_mcp.backends._daemonless.pipes import PipeProcess
from llm_sandbox_mcp.languages import runner_source
from llm_sandbox_mcp.models import WORKDIR, ExecResult, OutputListener, SandboxRef, SandboxSpec

OUTPUT_DIR = "/tmp/outputs"
# Runs in the new namespaces as `sh -c WRAPPER runner ARGV...`: a fresh /tmp, the output directory, then the runner.
_WRAPPER = (
    f'mount -t tmpfs -o size=64m,mode=1777 tmpfs /tmp && mkdir {OUTPUT_DIR} /tmp/work && cd /tmp/work && exec "$@"'
)
_UNSHARE = ["unshare", "--user", "--map-current-user", "--pid", "--fork", "--mount-proc", "--kill-child"]

STAND_IN_MOUNTS = '''

def fresh_mounts(config):
    """The test's stand-in: a root of the child's own (a tmpfs with the host's top-level directories bound in),
    with a /proc of its PID namespace, an empty /tmp and a /workspace."""
    mount("none", "/", "", MS_REC | MS_PRIVATE)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp']},mode=1777")
    root = "/tmp/root"
    os.mkdir(root)
    for name in os.listdir("/"):
        path, target = "/" + name, root + "/" + name
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path) and name not in ("proc", "tmp", "workspace"):
            os.mkdir(target)
            mount(path, target, "", MS_BIND | MS_REC)
    for name, mode in (("proc", 0o555), ("tmp", 0o1777), ("workspace", 0o700)):
        os.mkdir(root + "/" + name)
        os.chmod(root + "/" + name, mode)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chroot(root)
'''


def _with_stand_in(argv: Sequence[str]) -> list[str]:
    isolation = runner_source("python_isolation.py")
    return [part + STAND_IN_MOUNTS if part == isolation else part for part in argv]


@dataclass
class HostCgroup:
    """A zygote child's "cgroup": the child is PID 1 of its own PID namespace, so killing it ends the call. Held
    by a pidfd taken while the child lives, so that a reused pid is never signalled."""

    pidfd: int = -1
    killed: bool = False

    def kill(self) -> None:
        self.killed = True
        self._signal()

    def remove(self) -> None:
        self._signal()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def _signal(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)


@dataclass
class HostRunners:
    """A Backend that starts runners on the host, recording the execs (`calls`) and kills the server asks for."""

    name: str = "host"
    install_network: str = "none"
    calls: list[list[str]] = field(default_factory=lambda: [])
    killed: list[str] = field(default_factory=lambda: [])
    processes: dict[str, Process] = field(default_factory=lambda: {})
    cgroups: list[HostCgroup] = field(default_factory=lambda: [])

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        return SandboxRef(f"host-{len(self.processes)}", spec)

    async def _spawn(self, ref: SandboxRef, argv: Sequence[str], env: Mapping[str, str], fds: Sequence[int]) -> Process:
        # The runners find this interpreter as python3 (the server starts them as `python3 -c ...`).
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        # The output directory is always the fresh /tmp's: never a path of the host's file system.
        full_env = {"HOME": "/tmp", "LANG": "C.UTF-8", **env, "PATH": path, "OUTPUT_DIR": OUTPUT_DIR}
        command = [*_UNSHARE, "sh", "-c", _WRAPPER, "runner", *_with_stand_in(argv)]
        process = await anyio.open_process(command, env=full_env, pass_fds=fds)
        self.processes[ref.id] = process
        return process

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> PipeProcess:
        return PipeProcess(await self._spawn(ref, argv, env or {}, ()))

    async def start_template(
        self, ref: SandboxRef, argv: Sequence[str], env: Mapping[str, str], control_fd: int, calls: int
    ) -> PipeProcess:
        return PipeProcess(await self._spawn(ref, argv, env, (control_fd,)))

    async def child_cgroup(self, ref: SandboxRef) -> HostCgroup:
        cgroup = HostCgroup()
        self.cgroups.append(cgroup)
        return cgroup

    async def confine_child(self, ref: SandboxRef, pid: int, cgroup: HostCgroup) -> None:
        cgroup.pidfd = os.pidfd_open(pid)

    def _signal_runner(self, ref: SandboxRef, number: signal.Signals) -> None:
        """Signal the runner: the one child of `unshare`, PID 1 in its namespace (gone once it has ended)."""
        process = self.processes.get(ref.id)
        if process is None:
            return
        try:
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        except OSError:
            return
        if children:  # never os.kill(0, ...): that is this test's own process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(children[0]), number)

    async def exec(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
        output_limit: int | None = None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        self.calls.append(list(argv))
        raise AssertionError(f"the server ran {list(argv)} in a runner's sandbox")

    async def kill_all(self, ref: SandboxRef) -> None:
        self.killed.append(ref.id)
        self._signal_runner(ref, signal.SIGKILL)

    async def destroy(self, ref: SandboxRef) -> None:
        await self._end(ref.id)

    async def drop_cache(self, key: str) -> None:
        return None

    async def sweep(self) -> int:
        return 0

    async def describe(self) -> str:
        return "runners as host processes"

    async def _end(self, key: str) -> None:
        process = self.processes.pop(key, None)
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()  # unshare --kill-child: its child, the runner's PID 1, dies with it
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()

    async def aclose(self) -> None:
        for cgroup in self.cgroups:
            cgroup.remove()
        for key in list(self.processes):
            await self._end(key)
