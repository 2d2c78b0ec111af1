"""Fresh Python sandboxes at the cost of a fork (SANDBOX_ZYGOTE, bubblewrap only).

A *template* per sandbox kind (image, limits, libraries) is one bubblewrap sandbox whose Python process (the
zygote, runners/python_zygote.py) has paid the interpreter start and the kernel's imports. Per call the server
hands it one end of a fresh socket pair; it forks a child that makes a sandbox of its own inside the
template's (new namespaces, fresh tmpfs /workspace, /tmp and /dev/shm), says hello on that socket, and
waits. The kernel attaches the child's host pid to the hello (SCM_CREDENTIALS, which the child cannot
forge); the server moves that process into a cgroup of its own with the call's limits, and only then sends
the request, after which the child drops every capability, applies the strict seccomp
filter and runs the code with the kernel's frame protocol. Timeouts, floods and cancellation kill the
call's cgroup from outside.

Where it cannot work (another backend, a host without nested user namespaces, a template that does not
start), calls take the warm pool as before: the reason is logged once per sandbox kind and `doctor` says it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from llm_sandbox_mcp.backends import Backend, SandboxProcess
from llm_sandbox_mcp.background import TaskOwner
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError, SandboxFailure
from llm_sandbox_mcp.languages import Language, runner_source
from llm_sandbox_mcp.models import WORKDIR, ExecResult, Limits, Live, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.environment import run_env
from llm_sandbox_mcp.run.kernel import Kernel, drop_uncollected_files, encode_frame
from llm_sandbox_mcp.run.pool import IDLE_SECONDS

logger = logging.getLogger(__name__)

_HELLO_SECONDS = 10.0
_MAX_TEMPLATES = 4
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_MAX_HELLO = 4096


def isolation_config(settings: Settings, limits: Limits, rlimits: Mapping[str, int]) -> dict[str, object]:
    """What runners/python_isolation.py gives each child sandbox: tmpfs sizes, the strict seccomp filter, these
    rlimits, and a CPU limit. Children wait for their call with it already set, so it is the longest timeout
    allowed; the call's own timeout is kept by its kernel, and from outside."""
    from llm_sandbox_mcp.seccomp.bpf import FILTER

    return {
        "workspace": limits.workspace_bytes,
        "tmp": limits.tmp_bytes,
        "seccomp": FILTER.hex(),
        "rlimits": dict(rlimits),
        "cpu": math.ceil(settings.sandbox_max_timeout) + 1,
    }


class ChildCgroup(Protocol):
    """The cgroup a zygote child runs in (blocking calls: run in a worker thread)."""

    def kill(self) -> None: ...

    def remove(self) -> None: ...


@runtime_checkable
class TemplateHost(Protocol):
    """A backend that can run zygote templates (bubblewrap)."""

    async def start_template(
        self, ref: SandboxRef, argv: Sequence[str], env: Mapping[str, str], control_fd: int, calls: int
    ) -> SandboxProcess: ...

    async def child_cgroup(self, ref: SandboxRef) -> ChildCgroup: ...

    async def confine_child(self, ref: SandboxRef, pid: int, cgroup: ChildCgroup) -> None: ...


class ChildUnavailable(SandboxFailure):
    """A template could not give a call a child sandbox (the call then takes the pool). `host`: the child said
    it cannot make its sandbox here, so no template of this kind will."""

    def __init__(self, message: str, host: bool = False) -> None:
        super().__init__(message)
        self.host = host


class SocketProcess:
    """A zygote child's frame socket as a SandboxProcess (it has no stderr of its own)."""

    def __init__(self, sock: socket.socket, pending: bytes) -> None:
        self._sock = sock
        self._pending = pending

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self._sock.send(view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
            except OSError as exc:
                raise SandboxFailure(f"The sandbox process is gone ({exc.strerror})") from exc

    async def receive(self, timeout: float) -> bytes | None:
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        with anyio.move_on_after(timeout):
            while True:
                try:
                    return self._sock.recv(65536)
                except BlockingIOError:
                    await anyio.wait_readable(self._sock)
                except OSError:
                    return b""
        return None

    def stderr_tail(self) -> bytes:
        return b""

    def waiting(self) -> bool:
        """Whether the child is still there and has said nothing since its hello (a child forked ahead)."""
        if self._pending:
            return False
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    async def aclose(self) -> None:
        self._sock.close()


async def _hello(sock: socket.socket) -> tuple[int, bytes]:
    """The host pid the kernel attached to the child's first message, and the message. Raises
    ChildUnavailable with what the child said instead of a hello (its setup failed)."""
    try:
        with anyio.fail_after(_HELLO_SECONDS):
            while True:
                try:
                    data, ancillary, _, _ = sock.recvmsg(_MAX_HELLO, socket.CMSG_SPACE(_CREDENTIALS.size))
                    break
                except BlockingIOError:
                    await anyio.wait_readable(sock)
    except TimeoutError:
        raise ChildUnavailable("a zygote child did not get ready in time") from None
    except OSError as exc:
        raise ChildUnavailable(f"a zygote child's socket failed: {exc.strerror}") from exc
    pid = 0
    for level, kind, body in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(body) >= _CREDENTIALS.size:
            pid = _CREDENTIALS.unpack_from(body)[0]
    if not data.startswith(b"H") or pid <= 0:
        said = data.decode("utf-8", errors="replace").strip()[:500]
        raise (
            ChildUnavailable(said, host=True) if said else ChildUnavailable("a zygote child ended before it was ready")
        )
    return pid, data


@dataclass(eq=False)
class Child:
    """A child that made its sandbox, is in its own cgroup and waits for its one request."""

    kernel: Kernel
    cgroup: ChildCgroup


@dataclass(eq=False)
class Template:
    spec: SandboxSpec
    ref: SandboxRef
    kernel: Kernel
    control: socket.socket
    charged: int
    # Children forked ahead (pristine copies of the template, none has run anything), taken one per call.
    ready: list[Child] = field(default_factory=lambda: list[Child]())
    forking: int = 0
    # How many to keep ready: SANDBOX_POOL_SIZE, doubled (up to SANDBOX_MAX_CONCURRENCY) each time a call finds
    # none, as the pool grows under load; a waiting child holds a process and a cgroup, hardly any memory.
    ahead: int = 0
    in_service: bool = True
    # Calls running in its children, and when the last one ended (for going back to SANDBOX_POOL_SIZE).
    running: int = 0
    used: float = field(default_factory=time.monotonic)


class Zygotes(TaskOwner):
    """The templates of this server, one per sandbox kind, with the calls they fork. Use as an async context
    manager: children are forked ahead and used cgroups removed in the background, templates at the end."""

    def __init__(self, settings: Settings, backend: Backend, budget: MemoryBudget) -> None:
        self._settings = settings
        self._backend = backend
        self._host = backend if settings.sandbox_zygote and isinstance(backend, TemplateHost) else None
        self._budget = budget
        # Like the pool's: how many sandboxes of a kind are ready before a call needs one.
        self._ahead = settings.sandbox_pool_size
        self._templates: dict[SandboxSpec, Template] = {}
        self._locks: dict[SandboxSpec, anyio.Lock] = {}
        # Sandbox kinds no template can serve here, and why; how many calls children ran.
        self.unavailable: dict[SandboxSpec, str] = {}
        self.served = 0
        # After this long without a call, a template that keeps more children ready than it started with
        # goes back to SANDBOX_POOL_SIZE, as the pool does.
        self.idle = IDLE_SECONDS

    def _started(self, tasks: TaskGroup) -> None:
        if self._host is not None and self._settings.sandbox_max_concurrency > self._ahead:
            tasks.start_soon(self._shrink_idle)

    async def _shrink_idle(self) -> None:
        while True:
            await anyio.sleep(self.idle / 4)
            now = time.monotonic()
            for template in list(self._templates.values()):
                if template.ahead <= self._ahead or template.running or now - template.used < self.idle:
                    continue
                template.ahead = self._ahead
                extra, template.ready = template.ready[self._ahead :], template.ready[: self._ahead]
                for child in extra:
                    await self._close(child)

    async def _after_tasks(self) -> None:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as removals:
                for template in list(self._templates.values()):
                    removals.start_soon(self._remove, template)
            self._templates.clear()

    def serves(self, language: Language, spec: SandboxSpec) -> bool:
        """Whether calls of this kind go to a template (when it works here)."""
        read_only_cache = spec.cache is None or not spec.cache.writable
        return (
            self._host is not None
            and language.name == "python"
            and read_only_cache
            and not spec.egress
            and spec not in self.unavailable
        )

    def warm(self, language: Language, spec: SandboxSpec) -> None:
        if self.serves(language, spec) and self._tasks is not None:
            self._tasks.start_soon(self._template, language, spec)

    async def check(self, language: Language, spec: SandboxSpec) -> str:
        """For `doctor`: whether calls of this kind run in zygote children here, or why not."""
        if self._host is None:
            return f"not used: BACKEND={self._backend.name} has no zygote (bubblewrap only)"
        result = await self.run(language, spec, "print(1)", 30, Live())
        if result is None:
            return f"not used, calls take the pool: {self.unavailable.get(spec, 'the template is not available')}"
        if result.exit_code != 0 or result.stdout != b"1\n":
            return f"a child's run failed (exit {result.exit_code}); calls still use it"
        return "works: Python one-shot calls run in children of a template"

    async def run(
        self, language: Language, spec: SandboxSpec, code: str, timeout: float, live: Live
    ) -> ExecResult | None:
        """Run a one-shot program in a fresh child of the kind's template, or None when no template can."""
        if not self.serves(language, spec):
            return None
        template = await self._template(language, spec)
        if template is None:
            return None
        template.running += 1
        try:
            return await self._run_in_child(language, template, code, timeout, live)
        finally:
            template.running -= 1
            template.used = time.monotonic()

    async def _run_in_child(
        self, language: Language, template: Template, code: str, timeout: float, live: Live
    ) -> ExecResult | None:
        spec = template.spec
        with self._budget.held(spec.limits.memory_bytes, "a sandbox"):
            child = await self._take(template)
            if child is None:
                if 0 < template.ahead < self._settings.sandbox_max_concurrency:
                    template.ahead = min(self._settings.sandbox_max_concurrency, template.ahead * 2)
                try:
                    child = await self._fork(template)
                except ChildUnavailable as exc:
                    await self._give_up(template, exc)
                    return None
            self._refill(template)
            self.served += 1
            try:
                result = await child.kernel.run(
                    code,
                    mode="fork",
                    echo=False,
                    filename=str(WORKDIR / language.file_name),
                    timeout=timeout,
                    output_limit=self._settings.sandbox_output_limit,
                    artifact_limit=self._settings.sandbox_artifact_limit,
                    live=live,
                )
            finally:
                with anyio.CancelScope(shield=True):
                    await self._close(child)
        if child.kernel.collect_outside:
            drop_uncollected_files(result)
        return result

    async def _take(self, template: Template) -> Child | None:
        """A child forked ahead that is still waiting, if there is one."""
        while template.ready:
            child = template.ready.pop(0)
            if isinstance(child.kernel.process, SocketProcess) and child.kernel.process.waiting():
                return child
            await self._close(child)
        return None

    async def _template(self, language: Language, spec: SandboxSpec) -> Template | None:
        lock = self._locks.setdefault(spec, anyio.Lock())
        async with lock:
            template = self._templates.get(spec)
            if template is not None and template.kernel.alive:
                return template
            if template is not None:
                await self._drop(template)
            if spec in self.unavailable:
                return None
            try:
                template = await self._start(language, spec)
            except SandboxError as exc:
                self._mark(spec, f"its template did not start: {exc}")
                return None
            self._templates[spec] = template
            while len(self._templates) > _MAX_TEMPLATES:
                await self._drop(next(iter(self._templates.values())))
            self._refill(template)
            return template

    async def _start(self, language: Language, spec: SandboxSpec) -> Template:
        assert self._host is not None
        charge = spec.limits.memory_bytes
        self._budget.reserve(charge, "a Python template")
        ref: SandboxRef | None = None
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ref = await self._backend.create(spec)
            limits = spec.limits
            # The per-exec rlimits of the backend (`_confine`), which each child sets itself.
            rlimits = {
                "NOFILE": limits.nofile,
                "FSIZE": max(limits.workspace_bytes, limits.tmp_bytes),
                "CORE": 0,
                "NPROC": limits.pids,
            }
            config = {"control": theirs.fileno(), **isolation_config(self._settings, limits, rlimits)}
            argv = [
                "python3", "-c", runner_source("python_zygote.py"), runner_source("python_kernel.py"),
                runner_source("python_isolation.py"), json.dumps(config),
            ]  # fmt: skip
            env = {**run_env(language, spec), "LLM_SANDBOX_PRELOAD": "1"}
            # Children alive at once: as many running as calls may run, as many again waiting ahead, in the making.
            calls = 2 * self._settings.sandbox_max_concurrency + 2
            process = await self._host.start_template(ref, argv, env, theirs.fileno(), calls)
            kernel = await Kernel.greet(self._backend, ref, process, "The Python zygote")
        except BaseException:
            control.close()
            with anyio.CancelScope(shield=True):
                if ref is not None:
                    await self._backend.destroy(ref)
            self._budget.release(charge)
            raise
        finally:
            theirs.close()
        control.setblocking(False)
        return Template(spec, ref, kernel, control, charge, ahead=self._ahead)

    async def _fork(self, template: Template) -> Child:
        """A new child of `template`, ready for its request. Raises ChildUnavailable."""
        assert self._host is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            ours.setblocking(False)
            try:
                socket.send_fds(template.control, [b"F"], [theirs.fileno()])
            except OSError as exc:  # the zygote is gone or stuck
                template.kernel.alive = False
                raise ChildUnavailable(f"the template does not take requests ({exc.strerror})") from exc
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        cgroup: ChildCgroup | None = None
        try:
            pid, hello = await _hello(ours)
            cgroup = await self._child_cgroup(template)
            await self._host.confine_child(template.ref, pid, cgroup)
            process = SocketProcess(ours, hello)
            kernel = await Kernel.greet(self._backend, template.ref, process, "A zygote child")
            kernel.keeps_time = True
            await process.send(encode_frame(b"G"))  # in its cgroup: it may start the program's process
        except BaseException as exc:
            ours.close()
            if cgroup is not None:
                with anyio.CancelScope(shield=True):
                    await self._discard(cgroup)
            if isinstance(exc, SandboxFailure) and not isinstance(exc, ChildUnavailable):
                raise ChildUnavailable(str(exc)) from exc
            raise
        assert cgroup is not None
        killer = cgroup

        async def kill() -> None:
            await anyio.to_thread.run_sync(killer.kill)

        kernel.killer = kill
        return Child(kernel, killer)

    async def _child_cgroup(self, template: Template) -> ChildCgroup:
        assert self._host is not None
        made: ChildCgroup | None = None
        with anyio.CancelScope(shield=True):  # once made it must be removed: not lost to a cancellation
            made = await self._host.child_cgroup(template.ref)
        assert made is not None
        return made

    def _refill(self, template: Template) -> None:
        if self._tasks is None or not template.in_service:
            return
        for _ in range(len(template.ready) + template.forking, template.ahead):
            template.forking += 1
            self._tasks.start_soon(self._fork_ahead, template)

    async def _fork_ahead(self, template: Template) -> None:
        try:
            child = await self._fork(template)
        except ChildUnavailable as exc:
            await self._give_up(template, exc)
            return
        except SandboxError as exc:  # background work never ends the server
            logger.info("Could not fork a Python sandbox ahead: %s", exc)
            return
        finally:
            template.forking -= 1
        if template.in_service:
            template.ready.append(child)
        else:
            await self._close(child)

    async def _close(self, child: Child) -> None:
        """End a child (its socket closed: a child still waiting for its request exits) and its cgroup."""
        await child.kernel.aclose()
        await self._discard(child.cgroup)

    async def _discard(self, cgroup: ChildCgroup) -> None:
        """Remove a used cgroup (and anything left in it), off the call's path while the server runs."""
        if self._tasks is not None:
            self._tasks.start_soon(self._remove_cgroup, cgroup)
        else:
            await self._remove_cgroup(cgroup)

    async def _remove_cgroup(self, cgroup: ChildCgroup) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(cgroup.remove)

    async def _give_up(self, template: Template, problem: ChildUnavailable) -> None:
        """A child could not be made: a host that cannot make children sends this kind to the pool for good,
        anything else replaces the template at the next call."""
        if not template.in_service:
            return
        if problem.host:
            self._mark(template.spec, str(problem))
        else:
            logger.info("A Python template is replaced (%s); this call takes the pool", problem)
        await self._drop(template)

    def _mark(self, spec: SandboxSpec, reason: str) -> None:
        self.unavailable[spec] = reason
        logger.warning("Python calls use the warm pool instead of a zygote: %s", reason)

    async def _drop(self, template: Template) -> None:
        if self._templates.get(template.spec) is template:
            del self._templates[template.spec]
        await self._remove(template)

    async def _remove(self, template: Template) -> None:
        with anyio.CancelScope(shield=True):
            template.in_service = False
            ready, template.ready = template.ready, []
            for child in ready:
                await self._close(child)
            template.control.close()
            with contextlib.suppress(SandboxError):
                await template.kernel.aclose()
                await self._backend.destroy(template.ref)
            self._budget.release(template.charged)
            template.charged = 0
