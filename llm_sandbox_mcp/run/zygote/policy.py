"""Which one-shot calls fork their sandboxes, and on which flavour of zygote: one answer for every engine.

The flavour is a capability the backend declares, never its name: a `TemplateHost` (bubblewrap, NsJail) forks each
call from a template process and confines the child from the host; `TemplateContainers` (Docker, Podman) lend
a template container whose kernel forks each call a sandbox of its own. Only Python one-shot calls fork, and
only without a writable library cache or egress (and, in template containers, only with a read-only root); a
kind that could not fork here takes the warm pool from then on (logged once, shown by `doctor`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from enum import Enum

from llm_sandbox_mcp.backends import Backend, TemplateContainers, TemplateHost
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.languages import Language
from llm_sandbox_mcp.models import Limits, SandboxSpec

logger = logging.getLogger(__name__)


class Flavour(Enum):
    """Where a forked call's sandbox is made."""

    TEMPLATE = "a template's child"  # bubblewrap, NsJail: runners/python_zygote.py forks it, the host confines it
    CONTAINER = "a template container's child"  # Docker, Podman: the container's kernel forks it


def flavour_of(backend: Backend) -> Flavour | None:
    """The zygote flavour `backend` declares it can host, if any."""
    if isinstance(backend, TemplateHost):
        return Flavour.TEMPLATE
    if isinstance(backend, TemplateContainers) and backend.template_containers:
        return Flavour.CONTAINER
    return None


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


class ZygotePolicy:
    """Whether a call forks (`forks`), the sandbox kinds that cannot here and why, and how many calls forked."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.backend_name = backend.name
        self.flavour = flavour_of(backend) if settings.sandbox_zygote else None
        # Keyed by the call's plain spec (`forks` unset).
        self.unavailable: dict[SandboxSpec, str] = {}
        # Calls a zygote child ran.
        self.served = 0

    def forks(self, language: Language, spec: SandboxSpec) -> Flavour | None:
        """The flavour a one-shot call of this kind forks on, or None when it takes the warm pool."""
        writable_cache = spec.cache is not None and spec.cache.writable
        if self.flavour is None or language.name != "python" or writable_cache or spec.egress:
            return None
        if self.flavour is Flavour.CONTAINER and not spec.limits.read_only:
            # A writable root (SANDBOX_READ_ONLY=false) is the template container's, the same for every call
            # it serves: only /workspace, /tmp and /dev/shm are each child's own.
            return None
        return None if replace(spec, forks=False) in self.unavailable else self.flavour

    def mark(self, spec: SandboxSpec, reason: str) -> None:
        """Calls of this kind take the pool from now on (logged once)."""
        plain = replace(spec, forks=False)
        if plain not in self.unavailable:
            logger.warning("Python calls use the warm pool instead of %s: %s", self._where(), reason)
        self.unavailable[plain] = reason

    def status(self, spec: SandboxSpec, forked: bool, exit_code: int | None, stdout: str) -> str:
        """For `doctor`, after a check run of `print(1)` (`forked`: a zygote child ran it): whether Python one-shot
        calls fork their sandboxes here, or why not."""
        if self.flavour is None:
            return f"not used: BACKEND={self.backend_name} has no zygote (bubblewrap, NsJail, Docker and Podman have)"
        plain = replace(spec, forks=False)
        if plain in self.unavailable:
            return f"not used, calls take the pool: {self.unavailable[plain]}"
        if not forked:
            return f"the check did not run in {self._where()}'s child (see the log); calls still try them"
        if exit_code != 0 or stdout != "1\n":
            return f"a child's run failed (exit {exit_code}); calls still use it"
        return f"works: Python one-shot calls run in fresh sandboxes forked in {self._where()}"

    def _where(self) -> str:
        return "a zygote template container" if self.flavour is Flavour.CONTAINER else "a zygote template"
