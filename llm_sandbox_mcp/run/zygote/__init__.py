"""SANDBOX_ZYGOTE: Python one-shot calls in fresh sandboxes at the cost of a fork, in one of two flavours.

`policy` answers, the same way for every engine, whether a call forks and on which flavour (the backend's
declared capability). `templates` is the template flavour (bubblewrap, NsJail: a template process forks each call a
child the host confines); `containers` the container flavour (Docker, Podman: a pooled template container
whose kernel forks each call a sandbox of its own). Either lends the call's sandbox as a lease, which runs
through the executor's one run like every other (`run.leases`).
"""

from __future__ import annotations

from types import TracebackType

from llm_sandbox_mcp.languages import Language
from llm_sandbox_mcp.models import SandboxSpec
from llm_sandbox_mcp.run.leases import SandboxSource
from llm_sandbox_mcp.run.zygote.containers import ContainerTemplates
from llm_sandbox_mcp.run.zygote.policy import Flavour, ZygotePolicy
from llm_sandbox_mcp.run.zygote.templates import ZygoteTemplates


class Zygote:
    """Both flavours behind the one policy. Use as an async context manager (the templates' background work)."""

    def __init__(self, policy: ZygotePolicy, templates: ZygoteTemplates, containers: ContainerTemplates) -> None:
        self.policy = policy
        self.templates = templates
        self.containers = containers

    async def __aenter__(self) -> Zygote:
        await self.templates.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.templates.__aexit__(exc_type, exc, tb)

    def source(self, language: Language, spec: SandboxSpec) -> SandboxSource | None:
        """Where a one-shot call of this kind forks its sandbox, or None when it takes the warm pool."""
        flavour = self.policy.forks(language, spec)
        if flavour is Flavour.TEMPLATE:
            return self.templates
        if flavour is Flavour.CONTAINER:
            return self.containers
        return None
