"""The zygote's template flavour (a `TemplateHost`: bubblewrap, NsJail): fresh Python sandboxes at the cost of a
fork.

A *template* is one bubblewrap or NsJail sandbox whose Python process (the zygote, runners/python_zygote.py) has
paid the interpreter start and the kernel's imports; each sandbox kind (image, limits, libraries) has two, one
with numpy and matplotlib preloaded and a lean one, and a call is forked from the one its code suits
(`preloads`: a fork of the lean one costs half the CPU). Per call the server
hands it one end of a fresh socket pair; it forks a child that makes a sandbox of its own inside the
template's (new namespaces, fresh tmpfs /workspace, /tmp and /dev/shm), says hello on that socket, and
waits. The kernel attaches the child's host pid to the hello (SCM_CREDENTIALS, which the child cannot
forge); the server moves that process into a cgroup of its own with the call's limits, and only then sends
the request, after which the child drops every capability, applies the strict seccomp
filter (on NsJail stacked on the template's Kafel policy) and runs the code with the kernel's frame protocol.
Timeouts, floods and cancellation kill the call's cgroup from outside.

Each call's child is lent as a lease (`ZygoteTemplates.lend`) and runs through the executor's one run like
any other sandbox. Where it cannot work (a host without nested user namespaces, a template that does not
start), calls take the warm pool: the reason is logged once per sandbox kind and `doctor` says it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import time
from dataclasses import dataclass, field, replace

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.backends import Backend, ChildCgroup, TemplateHost
from llm_sandbox_mcp.background import TaskOwner
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError, SandboxFailure
from llm_sandbox_mcp.languages import Language, runner_source
from llm_sandbox_mcp.models import Execution, SandboxRef, SandboxSpec
from llm_sandbox_mcp.proc_masks import PROC_MASKED
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.environment import run_env
from llm_sandbox_mcp.run.kernel import Kernel, encode_frame
from llm_sandbox_mcp.run.leases import Lease, Loan
from llm_sandbox_mcp.run.pool import IDLE_SECONDS
from llm_sandbox_mcp.run.zygote.policy import Flavour, ZygotePolicy, isolation_config
from llm_sandbox_mcp.run.zygote.preloads import wants_preloaded

logger = logging.getLogger(__name__)

_HELLO_SECONDS = 10.0
_MAX_TEMPLATES = 6  # three sandbox kinds' two templates each
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_MAX_HELLO = 4096


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
    # numpy and matplotlib loaded before any child is forked (`preloads`: the kind's other template has not).
    preloaded: bool = True
    # Children forked ahead (pristine copies of the template, none has run anything), taken one per call.
    ready: list[Child] = field(default_factory=lambda: list[Child]())
    forking: int = 0
    # Set (and replaced) each time a fork ahead ends, with a child or without.
    arrived: anyio.Event = field(default_factory=anyio.Event)
    # How many to keep ready: SANDBOX_POOL_SIZE, doubled (up to SANDBOX_MAX_CONCURRENCY) each time a call finds
    # none, as the pool grows under load; a waiting child holds a process and a cgroup, hardly any memory.
    ahead: int = 0
    in_service: bool = True
    # Calls running in its children, and when the last one ended (for going back to SANDBOX_POOL_SIZE).
    running: int = 0
    used: float = field(default_factory=time.monotonic)


class ZygoteTemplates(TaskOwner):
    """The templates of this server, one per sandbox kind, lending the children they fork (a `SandboxSource`).
    Use as an async context manager: children are forked ahead and used cgroups removed in the background,
    templates at the end."""

    def __init__(self, settings: Settings, backend: Backend, budget: MemoryBudget, policy: ZygotePolicy) -> None:
        self._settings = settings
        self._backend = backend
        self._host = backend if policy.flavour is Flavour.TEMPLATE and isinstance(backend, TemplateHost) else None
        self._budget = budget
        self._policy = policy
        # Like the pool's: how many sandboxes of a kind are ready before a call needs one.
        self._ahead = settings.sandbox_pool_size
        # Two per sandbox kind at most: with numpy and matplotlib preloaded and without (`preloads`).
        self._templates: dict[tuple[SandboxSpec, bool], Template] = {}
        self._locks: dict[tuple[SandboxSpec, bool], anyio.Lock] = {}
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

    def warm(self, language: Language, spec: SandboxSpec) -> None:
        if self._host is not None and self._tasks is not None:
            for preloaded in (False, True):
                self._tasks.start_soon(self._template, language, spec, preloaded)

    async def lend(self, language: Language, spec: SandboxSpec, code: bytes = b"") -> Loan | None:
        """A fresh child of the kind's template that suits `code` (`preloads`), in its own cgroup and waiting
        for its one request, lent as a lease on the template's sandbox; None when no template can give one (the
        call then takes the pool)."""
        if self._host is None:
            return None
        template = await self._template(language, spec, wants_preloaded(code))
        if template is None:
            return None
        charge = 0
        template.running += 1
        try:
            charge = self._budget.reserve(spec.limits.memory_bytes, "a sandbox")
            try:
                child = await self._child(template)
            except BaseException:
                self._budget.release(charge)
                raise
        except BaseException:
            self._ended(template)
            raise
        if child is None:
            self._budget.release(charge)
            self._ended(template)
            return None
        self._policy.served += 1
        lease = Lease(template.ref, language, kernel=child.kernel, charged=charge, child=True)

        async def give_back(execution: Execution | None) -> None:
            try:
                await self._close(child)
            finally:
                self._budget.release(lease.charged)
                lease.charged = 0
                self._ended(template)

        return Loan(lease, give_back)

    async def _child(self, template: Template) -> Child | None:
        """A child forked ahead, else the first of the forks under way to give one (this call's own among them:
        one started earlier may well be ready sooner); None when the template gave up."""
        stages.note("source", "a zygote template's child")
        child = await self._take(template)
        if child is not None:
            stages.note("sandbox", "ready")
        elif self._tasks is not None and template.in_service:
            if 0 < template.ahead < self._settings.sandbox_max_concurrency:
                template.ahead = min(self._settings.sandbox_max_concurrency, template.ahead * 2)
            template.forking += 1
            self._tasks.start_soon(self._fork_ahead, template)
            while child is None and template.forking and template.in_service:
                await template.arrived.wait()
                child = await self._take(template)
            stages.note("sandbox", "the first of the forks under way")
        if not template.in_service:
            if child is not None:
                await self._close(child)
            return None
        if child is None:  # every fork under way failed, or the templates are closing: one more, on the call's path
            stages.note("sandbox", "forked for the call")
            try:
                child = await self._fork(template)
            except ChildUnavailable as exc:
                await self._give_up(template, exc)
                return None
        self._refill(template)
        return child

    @staticmethod
    def _ended(template: Template) -> None:
        template.running -= 1
        template.used = time.monotonic()

    async def _take(self, template: Template) -> Child | None:
        """A child forked ahead that is still waiting, if there is one."""
        while template.ready:
            child = template.ready.pop(0)
            if isinstance(child.kernel.process, SocketProcess) and child.kernel.process.waiting():
                return child
            await self._close(child)
        return None

    async def _template(self, language: Language, spec: SandboxSpec, preloaded: bool = True) -> Template | None:
        kind = (spec, preloaded)
        lock = self._locks.setdefault(kind, anyio.Lock())
        async with lock:
            template = self._templates.get(kind)
            if template is not None and template.kernel.alive:
                return template
            if template is not None:
                await self._drop(template)
            if spec in self._policy.unavailable:
                return None
            try:
                template = await self._start(language, spec, preloaded)
            except SandboxError as exc:
                self._policy.mark(spec, f"its template did not start: {exc}")
                return None
            self._templates[kind] = template
            while len(self._templates) > _MAX_TEMPLATES:
                await self._drop(next(iter(self._templates.values())))
            self._refill(template)
            return template

    async def _start(self, language: Language, spec: SandboxSpec, preloaded: bool) -> Template:
        assert self._host is not None
        charge = self._budget.reserve(spec.limits.memory_bytes, "a Python template")
        ref: SandboxRef | None = None
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Made to fork: its children mask what the holder would have (`spec.forks`, as a template container's).
            ref = await self._backend.create(replace(spec, forks=True))
            limits = spec.limits
            # The per-exec rlimits of the backend (`_confine`), which each child sets itself.
            rlimits = {
                "NOFILE": limits.nofile,
                "FSIZE": max(limits.workspace_bytes, limits.tmp_bytes),
                "CORE": 0,
                "NPROC": limits.pids,
            }
            config = {
                "control": theirs.fileno(),
                **isolation_config(self._settings, limits, rlimits),
                "mask": list(PROC_MASKED),
            }
            argv = [
                "python3", "-c", runner_source("python_zygote.py"), runner_source("python_kernel.py"),
                runner_source("python_isolation.py"), json.dumps(config),
            ]  # fmt: skip
            env = {**run_env(language, spec), "LLM_SANDBOX_PRELOAD": "1" if preloaded else "0"}
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
        return Template(spec, ref, kernel, control, charge, preloaded=preloaded, ahead=self._ahead)

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
        finally:
            # Whatever became of it, a call waiting for it looks again.
            template.arrived.set()
            template.arrived = anyio.Event()

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
            self._policy.mark(template.spec, str(problem))
        else:
            logger.info("A Python template is replaced (%s); this call takes the pool", problem)
        await self._drop(template)

    async def _drop(self, template: Template) -> None:
        if self._templates.get((template.spec, template.preloaded)) is template:
            del self._templates[(template.spec, template.preloaded)]
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
