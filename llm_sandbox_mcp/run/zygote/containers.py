"""Fresh sandboxes at the cost of a fork on Docker and Podman (SANDBOX_ZYGOTE): zygote template containers.

A template container is a pooled Python container (`SandboxSpec.forks`) whose kernel has paid the interpreter
start and the imports, and never runs user code itself. Each one-shot call runs in a child that first makes a
sandbox of its own inside the container (runners/python_isolation.py: new user, mount, PID, network, IPC and
UTS namespaces; fresh /workspace, /tmp, /dev/shm, /dev/mqueue, /proc and devpts; the engine's masked paths
masked again; every capability dropped, no_new_privs, the strict seccomp filter stacked) and whose PID
namespace ends with the call. The container serves one call at a time, so its cgroup limits are the call's.
The kernel forks the next child only once every process of the last call is gone, and the child's hello says
so: only then does the container go back to the pool (`Pool.recycle`). After anything abnormal (a timeout,
cancellation, a lost kernel, a kill, output over the limit, a signal's exit status, a protocol anomaly) or
SANDBOX_ZYGOTE_REUSE calls it is destroyed, as every pooled sandbox is today.

What the engine must allow the template, and only the template: the seccomp profile's template variant
(unshare, mount, sethostname) and unmasked /proc and /sys paths (Docker's `systempaths=unconfined`, Podman's
`unmask=ALL`), since the kernel refuses a new /proc where paths of the container's are masked. Where a child
cannot make its sandbox (AppArmor's docker-default denies mount; a host without unprivileged user namespaces)
the call takes the ordinary pool, and so does every later call of that kind: logged once, shown by `doctor`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import anyio

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.languages import Language
from llm_sandbox_mcp.models import Execution, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.proc_masks import MASKED, READ_ONLY
from llm_sandbox_mcp.run.kernel import Kernel, SandboxRefused
from llm_sandbox_mcp.run.leases import Lease, Loan, WarmKey
from llm_sandbox_mcp.run.pool import Pool
from llm_sandbox_mcp.run.zygote.policy import ZygotePolicy, isolation_config

logger = logging.getLogger(__name__)

# How long a used template container may take to have its next call's sandbox ready.
READY_SECONDS = 10.0


class ForksUnavailable(SandboxFailure):
    """A template container's children cannot make their sandboxes here: calls of this kind take the pool."""


class ContainerKernels:
    """A template container's kernel: started with the isolation config, and ready for its next call."""

    def __init__(self, settings: Settings, policy: ZygotePolicy) -> None:
        self._settings = settings
        self._policy = policy

    def config(self, limits: Limits) -> str:
        """The template kernel's config (runners/python_isolation.py)."""
        rlimits = {"NOFILE": limits.nofile, "CORE": 0}
        config = {
            **isolation_config(self._settings, limits, rlimits),
            "mask": list(MASKED),
            "read_only": list(READ_ONLY),
        }
        return json.dumps(config)

    async def start(self, backend: Backend, ref: SandboxRef, env: dict[str, str]) -> Kernel:
        """The kernel of a new template container, its first call's sandbox ready. Raises ForksUnavailable (and
        sends this kind to the pool from now on) when the child could not make its sandbox here."""
        # A template container serves many calls: its children inherit the imports, so they are always made.
        kernel = await Kernel.start(backend, ref, env, preload=True, forks=self.config(ref.spec.limits))
        try:
            await kernel.next_call(READY_SECONDS)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await kernel.aclose()
            if isinstance(exc, SandboxRefused):
                self._policy.mark(ref.spec, str(exc))
                raise ForksUnavailable(str(exc)) from exc
            raise
        return kernel

    def reusable(self, spec: SandboxSpec, execution: Execution, calls: int, kernel_alive: bool) -> bool:
        """Whether a template container may serve another call after this one: only after a clean one."""
        exit_code = execution.exit_code
        return (
            spec.forks
            and kernel_alive
            and not execution.timed_out
            and not execution.truncated
            and exit_code is not None
            and 0 <= exit_code < 128
            and calls < self._settings.sandbox_zygote_reuse
        )


class ContainerTemplates:
    """The container flavour as a source: template containers kept in the warm pool, lent to one call at a time
    and taken back (`Pool.recycle`) once ready for the next."""

    def __init__(self, pool: Pool[WarmKey, Lease], kernels: ContainerKernels, policy: ZygotePolicy) -> None:
        self._pool = pool
        self._kernels = kernels
        self._policy = policy

    def warm(self, language: Language, spec: SandboxSpec) -> None:
        self._pool.warm(WarmKey(language.name, replace(spec, forks=True)))

    async def lend(self, language: Language, spec: SandboxSpec, code: bytes = b"") -> Loan | None:
        """A template container for one call, or None (the call then takes the pool; it never fails for this).
        Every template container has numpy and matplotlib preloaded, whatever `code` imports."""
        key = WarmKey(language.name, replace(spec, forks=True))
        stages.note("source", "a zygote template container")
        try:
            lease = await self._pool.acquire(key, lend=True)
        except ForksUnavailable:
            return None
        except SandboxFailure as exc:
            logger.info("No zygote template container for this call (%s); it takes the pool", exc)
            return None

        async def give_back(execution: Execution | None) -> None:
            if execution is not None:
                lease.calls += 1
                self._policy.served += 1
                kernel = lease.kernel
                alive = kernel is not None and kernel.alive and not kernel.collect_outside
                if self._kernels.reusable(lease.ref.spec, execution, lease.calls, alive):
                    await self._pool.recycle(key, lease, self._ready_again)
                    return
            await self._pool.release(lease, key)

        return Loan(lease, give_back)

    async def _ready_again(self, lease: Lease) -> bool:
        """Whether a template container's kernel has the next call's sandbox ready (the last call's processes
        all gone)."""
        if lease.kernel is None:
            return False
        try:
            await lease.kernel.next_call(READY_SECONDS)
        except SandboxFailure as exc:
            logger.info("A zygote template container is not reused: %s", exc)
            return False
        return True
