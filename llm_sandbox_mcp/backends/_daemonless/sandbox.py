"""What the daemonless engines (bubblewrap, NsJail) share: a sandbox as namespaces on this host, held open by a
*holder* process per sandbox and entered by each exec, its cgroup (pids, memory, cpu) and rlimits, the kill from
outside through the cgroup, the state records and the sweep of what a dead server left, and zygote templates
(a template process per sandbox kind whose children the host moves into cgroups of their own).

`HostSandbox` is the base class; each engine supplies what differs per jail program (finding it, probing it,
starting the holder, the per-exec command line). As root the sandbox runs as the unprivileged SANDBOX_USER on
the host too: root ignores RLIMIT_NPROC, and a sandbox whose processes are host root is one bug away from owning
the host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import resource
import shutil
import signal
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Generic, Protocol, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import Process

from llm_sandbox_mcp.backends import _owner
from llm_sandbox_mcp.backends._daemonless.argv import SANDBOX_PATH, host_env
from llm_sandbox_mcp.backends._daemonless.cgroup import Cgroup, CgroupManager, existing
from llm_sandbox_mcp.backends._daemonless.host import HOST_PATH, cache_root, private_dir, state_root
from llm_sandbox_mcp.backends._daemonless.pipes import PipeProcess, feed, pump
from llm_sandbox_mcp.backends._userns import refused, sysctl_problem, userns_refused
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxFailure
from llm_sandbox_mcp.models import (
    EGRESS_NETWORK,
    OOM_SCORE_ADJ,
    WORKDIR,
    ExecResult,
    Limits,
    OutputListener,
    SandboxRef,
    SandboxSpec,
    captures,
)

logger = logging.getLogger(__name__)

NETWORK_MODES = ("none", "host")
# After a kill, how long the pipes may take to close before the output is returned as it is.
_DRAIN_SECONDS = 3.0
# After a normal exit: a background process the command left running may keep the pipes open for good.
_EXIT_DRAIN_SECONDS = 0.5
# The cgroup of one zygote child: this prefix, its template's sandbox id, a dash.
CALL_CGROUP_PREFIX = "call-"


class Jail(Protocol):
    """The program that makes a sandbox's namespaces (bwrap, nsjail), as found on this host."""

    @property
    def path(self) -> Path: ...

    def describe(self) -> str: ...


J = TypeVar("J", bound=Jail)


@dataclass(frozen=True)
class HostInfo(Generic[J]):
    jail: J
    nsenter: str
    cgroups: CgroupManager
    state: Path
    root: bool
    # Since Linux 5.14 RLIMIT_NPROC counts per user namespace; before, all processes of the host uid count.
    nproc_per_userns: bool


@dataclass(eq=False)
class Sandbox:
    id: str
    spec: SandboxSpec
    holder: Process
    holder_pid: int
    cgroup: Cgroup
    state_file: Path
    processes: set[Process] = field(default_factory=lambda: set[Process]())
    closed: bool = False


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


class HostSandbox(Generic[J]):
    """Sandboxes as namespaces on this host: a holder per sandbox, entered by each exec (see `argv`).

    What differs per jail program (finding it, the holder, the per-exec command) is in the subclasses.
    """

    name: str
    install_network = EGRESS_NETWORK  # its own network namespace: loopback only, the tunnel the way out

    def __init__(self, jail_path: Path | None, probe_uid: int = 65534, probe_gid: int = 65534) -> None:
        self._configured = jail_path
        self._probe_ids = (probe_uid, probe_gid)
        self._host_info: HostInfo[J] | None = None
        self._host_lock = anyio.Lock()
        self._boxes: dict[str, Sandbox] = {}
        self._memory_total: int | None = None

    # -- host discovery -------------------------------------------------------------------------------------

    async def _host(self) -> HostInfo[J]:
        async with self._host_lock:
            if self._host_info is None:
                self._host_info = await anyio.to_thread.run_sync(self._discover)
            return self._host_info

    def _discover(self) -> HostInfo[J]:
        if platform.system() != "Linux":
            raise BackendUnavailable(f"BACKEND={self.name} runs on Linux only; use BACKEND=docker or podman here")
        problem = sysctl_problem()
        if problem:
            raise userns_refused(self.name, None, f"the host has {problem}")
        nsenter = shutil.which("nsenter", path=HOST_PATH)
        if nsenter is None:
            raise BackendUnavailable(f"BACKEND={self.name} needs nsenter; install util-linux with your package manager")
        root = os.geteuid() == 0
        state = state_root()
        private_dir(state / "sandboxes", 0o700)
        jail = self._find_jail(state, root)
        # Before the cgroups: where neither works (inside a client's sandbox), the namespaces are the cause.
        self._probe(jail, root)
        cgroups = CgroupManager()
        if self._memory_total is not None:
            cgroups.hold_within(self._memory_total)
        missing = cgroups.missing()
        if missing is not None:
            raise BackendUnavailable(
                f"BACKEND={self.name} cannot bound memory, CPU and pids on this host ({missing}), and rlimits alone "
                f"bound neither shared memory nor CPU, so it will not run. {cgroup_fix(cgroups, root)}"
            )
        return HostInfo[J](
            jail=jail,
            nsenter=nsenter,
            cgroups=cgroups,
            state=state,
            root=root,
            nproc_per_userns=_kernel_at_least(5, 14),
        )

    def _find_jail(self, state: Path, root: bool) -> J:
        raise NotImplementedError

    def _probe(self, jail: J, root: bool) -> None:
        """A trivial sandbox, as the sandbox user, so a host that cannot make one fails here, clearly."""
        raise NotImplementedError

    def _refusal(self, jail: J, output: str) -> BackendUnavailable:
        """Why the jail could not make a sandbox here: refused user namespaces get their cause and fix."""
        if refused(output):
            return userns_refused(self.name, jail.path, output)
        return BackendUnavailable(f"{jail.describe()} cannot make a sandbox here: {output or 'no reason given'}")

    # -- the memory of all sandboxes together (`backends.SharedMemoryLimit`) --------------------------------------

    def limit_sandboxes_together(self, total: int) -> None:
        """The memory limit of the cgroup all of this server's sandboxes go under, written with the cgroups."""
        self._memory_total = total
        if self._host_info is not None:
            self._host_info.cgroups.hold_within(total)

    def sandboxes_memory(self) -> int | None:
        """What this server's sandboxes use together, or None before their shared limit holds."""
        return None if self._host_info is None else self._host_info.cgroups.in_use()

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        host = await self._host()
        limits = spec.limits
        if limits.network_mode not in NETWORK_MODES:
            raise SandboxFailure(
                f"Network mode {limits.network_mode!r} does not exist for BACKEND={self.name}: use 'none' (no network) "
                "or 'host' (the host's own network namespace, an operator's explicit SANDBOX_INSTALL_NETWORK_MODE=host)"
            )
        sandbox_id = uuid.uuid4().hex
        cache_dir = await anyio.to_thread.run_sync(self._cache_dir, host, spec) if spec.cache else None
        cgroup = await anyio.to_thread.run_sync(host.cgroups.create, f"sandbox-{sandbox_id}", limits)
        if cgroup is None:
            raise SandboxFailure(f"{self.name} could not make the sandbox's cgroup: {host.cgroups.problem}")
        state_file = host.state / "sandboxes" / f"{sandbox_id}.json"
        record = {"labels": _owner.owner_labels(), "cgroups": [str(d) for d in cgroup.dirs]}
        await anyio.Path(state_file).write_text(json.dumps(record))
        try:
            holder, holder_pid = await self._start_holder(host, spec, cache_dir)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._forget(cgroup, state_file)
            raise
        box = Sandbox(sandbox_id, spec, holder, holder_pid, cgroup, state_file)
        self._boxes[sandbox_id] = box
        return SandboxRef(id=sandbox_id, spec=spec)

    def _cache_dir(self, host: HostInfo[J], spec: SandboxSpec) -> Path:
        assert spec.cache is not None
        directory = cache_root() / _cache_name(spec.cache.key)
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        if host.root and spec.cache.writable:
            os.chown(directory, spec.limits.uid, spec.limits.gid)
        return directory

    async def _start_holder(self, host: HostInfo[J], spec: SandboxSpec, cache_dir: Path | None) -> tuple[Process, int]:
        """The holder process, running once its namespaces and mounts are in place, and the host pid of its PID 1."""
        raise NotImplementedError

    def _exec_command(
        self, host: HostInfo[J], box: Sandbox, argv: Sequence[str], env: Mapping[str, str], workdir: PurePosixPath
    ) -> tuple[list[str], tuple[int, ...]]:
        """The gated command line of one exec, and the descriptors it is passed (closed here once it started)."""
        raise NotImplementedError

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
        box = self._box(ref)
        started = time.monotonic()
        process = await self._spawn(box, argv, env or {}, workdir, cpu_seconds=math.ceil(timeout) + 1)
        out, err = captures(output_limit, on_output)
        timed_out = False
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(feed, process, stdin)
                assert process.stdout is not None and process.stderr is not None
                with anyio.move_on_after(timeout) as deadline:
                    tasks.start_soon(pump, process.stdout, out, deadline.cancel)  # a flood ends it like a timeout
                    tasks.start_soon(pump, process.stderr, err, deadline.cancel)
                    await process.wait()
                drain = _EXIT_DRAIN_SECONDS
                if deadline.cancelled_caught:
                    timed_out, drain = True, _DRAIN_SECONDS
                    await self._kill_all(box)
                tasks.cancel_scope.deadline = anyio.current_time() + drain
        finally:
            with anyio.CancelScope(shield=True):
                await self._reap(box, process)
        return ExecResult.captured(_exit_code(process.returncode), out, err, timed_out=timed_out, started=started)

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> PipeProcess:
        box = self._box(ref)
        return PipeProcess(await self._spawn(box, argv, env or {}, workdir, cpu_seconds=None))

    def _box(self, ref: SandboxRef) -> Sandbox:
        box = self._boxes.get(ref.id)
        if box is None or box.closed:
            raise SandboxFailure(f"The sandbox {ref.id[:12]} is gone (destroyed)")
        if box.holder.returncode is not None:
            raise SandboxFailure(f"The sandbox {ref.id[:12]} is gone: its holder process exited")
        return box

    async def _spawn(
        self,
        box: Sandbox,
        argv: Sequence[str],
        env: Mapping[str, str],
        workdir: PurePosixPath,
        cpu_seconds: int | None,
    ) -> Process:
        host = await self._host()
        command, fds = self._exec_command(host, box, argv, env, workdir)
        return await self._launch(host, box, command, fds, cpu_seconds)

    async def _launch(
        self,
        host: HostInfo[J],
        box: Sandbox,
        command: list[str],
        fds: tuple[int, ...],
        cpu_seconds: int | None,
        nproc: int | None = None,
        keep: tuple[int, ...] = (),
    ) -> Process:
        """Start a gated command; `fds` are passed and closed here, `keep` passed and left to the caller."""
        try:
            # As root: root's supplementary groups go now (if it has any: otherwise the cheaper vfork path stays
            # open), and nsenter switches the uid inside the holder.
            process = await anyio.open_process(
                command, cwd="/", env=host_env(), start_new_session=True, pass_fds=(*fds, *keep),
                extra_groups=[] if host.root and os.getgroups() else None,
            )  # fmt: skip
        except OSError as exc:
            raise SandboxFailure(f"Could not start a process in the sandbox: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        box.processes.add(process)
        try:
            limits, cgroup = box.spec.limits, box.cgroup
            await anyio.to_thread.run_sync(self._confine, host, limits, cgroup, process.pid, cpu_seconds, nproc)
            assert process.stdin is not None
            await process.stdin.send(b"\n")  # opens the gate
        except BaseException as exc:
            # Also when the caller is cancelled here: the gate never opens and would wait until destroy.
            with anyio.CancelScope(shield=True):
                await self._reap(box, process)
            if isinstance(exc, (OSError, anyio.BrokenResourceError)):
                raise SandboxFailure(f"Could not confine a process in the sandbox: {exc}") from exc
            raise
        return process

    def _confine(
        self, host: HostInfo[J], limits: Limits, cgroup: Cgroup, pid: int, cpu_seconds: int | None,
        nproc: int | None = None,
    ) -> None:  # fmt: skip
        """Limits on the gate process (or a zygote's child), inherited by everything it starts."""
        wanted = {
            resource.RLIMIT_NOFILE: limits.nofile,
            resource.RLIMIT_FSIZE: max(limits.workspace_bytes, limits.tmp_bytes),
            resource.RLIMIT_CORE: 0,
        }
        if cpu_seconds is not None:
            wanted[resource.RLIMIT_CPU] = cpu_seconds
        if host.nproc_per_userns:
            wanted[resource.RLIMIT_NPROC] = nproc or limits.pids
        for kind, value in wanted.items():
            # CPU: SIGXCPU at the soft limit (catchable), SIGKILL a little later.
            soft, hard = value, value + 5 if kind == resource.RLIMIT_CPU else value
            _, ceiling = resource.getrlimit(kind)
            if ceiling != resource.RLIM_INFINITY:
                soft, hard = min(soft, ceiling), min(hard, ceiling)
            resource.prlimit(pid, kind, (soft, hard))
        cgroup.place(pid)
        # The kernel kills sandboxes before the server when memory runs out (inherited by what the exec starts).
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(OOM_SCORE_ADJ))

    async def _reap(self, box: Sandbox, process: Process) -> None:
        if process.returncode is None:  # the caller was cancelled: the exec's own processes go too
            # The whole group: nsenter's forked child may not have armed its parent-death signal yet.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        with anyio.move_on_after(_DRAIN_SECONDS):
            await process.aclose()
        box.processes.discard(process)

    async def kill_all(self, ref: SandboxRef) -> None:
        box = self._boxes.get(ref.id)
        if box is not None and not box.closed:
            await self._kill_all(box)

    async def _kill_all(self, box: Sandbox) -> None:
        """From the host, through the sandbox's cgroup: nothing inside can stop or dodge it."""
        await anyio.to_thread.run_sync(box.cgroup.kill)
        for process in list(box.processes):
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def destroy(self, ref: SandboxRef) -> None:
        box = self._boxes.pop(ref.id, None)
        if box is None:
            return
        with anyio.CancelScope(shield=True):
            await self._destroy(box)

    async def _destroy(self, box: Sandbox) -> None:
        box.closed = True
        if box.holder.returncode is None:
            # PID 1 of the holder's PID namespace: when it dies the kernel kills every process in there.
            with contextlib.suppress(ProcessLookupError):
                os.kill(box.holder_pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                box.holder.kill()
        for process in list(box.processes):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for process in [box.holder, *box.processes]:
            with anyio.move_on_after(_DRAIN_SECONDS):
                await process.aclose()
        box.processes.clear()
        await self._forget(box.cgroup, box.state_file)

    async def _forget(self, cgroup: Cgroup, state_file: Path) -> None:
        await anyio.to_thread.run_sync(cgroup.remove)
        with contextlib.suppress(FileNotFoundError):
            await anyio.Path(state_file).unlink()

    async def drop_cache(self, key: str) -> None:
        await anyio.to_thread.run_sync(shutil.rmtree, cache_root() / _cache_name(key), True)

    async def sweep(self) -> int:
        host = await self._host()
        return await anyio.to_thread.run_sync(self._sweep, host)

    def _sweep(self, host: HostInfo[J]) -> int:
        swept = 0
        for state_file in (host.state / "sandboxes").glob("*.json"):
            if state_file.stem in self._boxes:
                continue
            try:
                record = json.loads(state_file.read_text())
            except (OSError, ValueError):
                continue
            if not _owner.owner_is_gone(record.get("labels") or {}):
                continue
            # The holder died with its server (--die-with-parent); only its cgroups can outlive it, and those
            # of its zygote children beside them.
            recorded: list[str] = record.get("cgroups") or []
            children = [
                str(path)
                for directory in recorded
                for path in Path(directory).parent.glob(f"{CALL_CGROUP_PREFIX}{state_file.stem}-*")
            ]
            existing([*children, *recorded]).remove()
            state_file.unlink(missing_ok=True)
            swept += 1
        host.cgroups.sweep_servers()
        return swept

    # -- zygote templates (see llm_sandbox_mcp.run.zygote): both jails are a `TemplateHost` ------------------

    def _template_command(
        self, host: HostInfo[J], box: Sandbox, argv: Sequence[str], env: Mapping[str, str], control_fd: int
    ) -> tuple[list[str], tuple[int, ...]]:
        """The gated command line of a zygote's template process, and the descriptors it is passed (closed here
        once it started): an exec as `_exec_command`'s, but whose jail leaves it able to make one user namespace
        per child (its seccomp policy lets unshare, mount and sethostname through: `TEMPLATE_PERMITS`), with
        `control_fd` left open under its own number."""
        raise NotImplementedError

    async def start_template(
        self, ref: SandboxRef, argv: Sequence[str], env: Mapping[str, str], control_fd: int, calls: int
    ) -> PipeProcess:
        """A zygote's template process (`_template_command`), handed `control_fd` (same number; the caller closes
        it). Its RLIMIT_NPROC leaves room for `calls` children at their own limit (a nested user namespace counts
        against its parents)."""
        box = self._box(ref)
        host = await self._host()
        if not host.nproc_per_userns:
            raise SandboxFailure("zygote children need Linux 5.14 or newer (RLIMIT_NPROC per user namespace)")
        command, fds = self._template_command(host, box, argv, env, control_fd)
        nproc = box.spec.limits.pids * (calls + 1)
        process = await self._launch(host, box, command, fds, None, nproc=nproc, keep=(control_fd,))
        return PipeProcess(process)

    async def child_cgroup(self, ref: SandboxRef) -> Cgroup:
        """A new cgroup with the sandbox's limits, for one child of its template (the caller removes it)."""
        box = self._box(ref)
        host = await self._host()
        # Named after the template's sandbox, so a sweep after a crash finds them by its record.
        name = f"{CALL_CGROUP_PREFIX}{box.id}-{uuid.uuid4().hex[:16]}"
        cgroup = await anyio.to_thread.run_sync(host.cgroups.create, name, box.spec.limits)
        if cgroup is None:
            raise SandboxFailure(f"{self.name} could not make a call's cgroup: {host.cgroups.problem}")
        return cgroup

    async def confine_child(self, ref: SandboxRef, pid: int, cgroup: Cgroup) -> None:
        """Move the template's child at host pid `pid` (only a process in the template's cgroup qualifies) into
        `cgroup`. The child sets its own rlimits (lowering them needs no privilege; setting another user's from
        here needs CAP_SYS_RESOURCE, which containers often lack)."""
        box = self._box(ref)
        await anyio.to_thread.run_sync(self._confine_child, box, pid, cgroup)

    def _confine_child(self, box: Sandbox, pid: int, cgroup: Cgroup) -> None:
        if pid not in box.cgroup.pids():
            raise SandboxFailure(f"process {pid} is not a child of the sandbox's template")
        try:
            cgroup.place(pid)
        except OSError as exc:
            raise SandboxFailure(f"Could not move a zygote child into its cgroup: {exc}") from exc

    def missing_runtime(self, executable: str) -> str | None:
        """Why a language cannot run here: the host lacks its runtime (this backend uses the host's)."""
        if shutil.which(executable, path=SANDBOX_PATH) is None:
            return f"{executable} is not installed on this host ({self.name} runs the host's own runtimes)"
        return None

    async def describe(self) -> str:
        host = await self._host()
        who = f"uid {self._probe_ids[0]}" + (" (dropped from root)" if host.root else " (mapped to this user)")
        return f"{host.jail.describe()}; user namespaces work; sandbox user {who}; {host.cgroups.describe()}"

    async def aclose(self) -> None:
        boxes = list(self._boxes.values())
        self._boxes.clear()
        with anyio.CancelScope(shield=True):
            for box in boxes:
                await self._destroy(box)
            if self._host_info is not None:
                await anyio.to_thread.run_sync(self._host_info.cgroups.close)


async def holder_error(holder: Process) -> str:
    with contextlib.suppress(ProcessLookupError):
        holder.kill()
    message = b""
    if holder.stderr is not None:
        with anyio.move_on_after(_DRAIN_SECONDS), contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            async for chunk in holder.stderr:
                message += chunk
    with anyio.move_on_after(_DRAIN_SECONDS):
        await holder.aclose()
    return message.decode(errors="replace").strip()


def cgroup_fix(cgroups: CgroupManager, root: bool) -> str:
    """How to give a server the cgroups it lacks: delegated ones for a server that is not root."""
    if root:
        return "Mount the cgroup pids, memory and cpu controllers (v1 or v2), or use Docker or Podman."
    who = f"{os.geteuid()}:{os.getegid()}"
    v1 = [str(h.parent) for h in cgroups.hierarchies if h.version == 1]
    if v1 and len(v1) == len(cgroups.hierarchies):
        directories = " ".join(v1)
        return (
            f"This server runs as uid {os.geteuid()}, not root, and may not create cgroups. Have root delegate "
            f"the ones it uses (cgroup v1 here; for this login session): `sudo mkdir -p {directories} && sudo chown "
            f"-R {who} {directories}`; or run the server as root, or use Docker or Podman."
        )
    return (
        f"This server runs as uid {os.geteuid()}, not root, and may not create cgroups: run it in a systemd user "
        "scope with the cgroup v2 controllers delegated (`systemd-run --user --scope -p Delegate=yes uvx "
        "llm-sandbox-mcp`), or as root, or use Docker or Podman."
    )


def _cache_name(key: str) -> str:
    if not key or not all(c.isalnum() or c in "-_." for c in key) or key.startswith("."):
        raise SandboxFailure(f"Invalid library cache key {key!r}")
    return key
