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

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.languages import Language
from llm_sandbox_mcp.models import Execution, Limits, SandboxSpec
from llm_sandbox_mcp.run.zygote import isolation_config

logger = logging.getLogger(__name__)

ENGINES = ("docker", "podman")
# How long a used template container may take to have its next call's sandbox ready.
READY_SECONDS = 10.0
# What Docker or Podman mask by default (their union, and /proc/interrupts): files behind /dev/null,
# directories behind an empty read-only tmpfs; then what they make read-only. A template's children do it in
# their own mount namespace.
MASKED = (
    "/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/sched_debug", "/proc/scsi", "/proc/timer_list", "/proc/timer_stats", "/sys/dev/block",
    "/sys/devices/virtual/powercap", "/sys/firmware", "/sys/fs/selinux",
)  # fmt: skip
READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class ForksUnavailable(SandboxFailure):
    """A template container's children cannot make their sandboxes here: calls of this kind take the pool."""


class Forks:
    """Which one-shot calls run in template containers, and the kinds that cannot here (and why)."""

    def __init__(self, settings: Settings, engine: str) -> None:
        self._settings = settings
        self.enabled = settings.sandbox_zygote and engine in ENGINES
        self.unavailable: dict[SandboxSpec, str] = {}
        # Calls served by a template container's child, and how many a container served before it went back.
        self.served = 0
        self.recycled = 0

    def spec(self, language: Language, spec: SandboxSpec) -> SandboxSpec:
        """The sandbox a one-shot call of this kind takes: a template container where one can serve it."""
        writable_cache = spec.cache is not None and spec.cache.writable
        if not self.enabled or language.name != "python" or writable_cache or spec.egress or spec in self.unavailable:
            return spec
        return replace(spec, forks=True)

    def mark(self, spec: SandboxSpec, reason: str) -> None:
        """Calls of this kind take the pool from now on (logged once)."""
        plain = replace(spec, forks=False)
        if plain not in self.unavailable:
            logger.warning("Python calls use the warm pool instead of a zygote template container: %s", reason)
        self.unavailable[plain] = reason

    def config(self, limits: Limits) -> str:
        """The template kernel's config (runners/python_isolation.py)."""
        rlimits = {"NOFILE": limits.nofile, "CORE": 0}
        config = {
            **isolation_config(self._settings, limits, rlimits),
            "mask": list(MASKED),
            "read_only": list(READ_ONLY),
        }
        return json.dumps(config)

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

    def status(self, spec: SandboxSpec, ran: bool) -> str:
        """For `doctor`: whether Python one-shot calls run in template containers' children here, or why not."""
        plain = replace(spec, forks=False)
        if plain in self.unavailable:
            return f"not used, calls take the pool: {self.unavailable[plain]}"
        if not ran:
            return "the check did not run in a template container's child (see the log); calls still try them"
        return "works: Python one-shot calls run in fresh sandboxes forked inside template containers"
