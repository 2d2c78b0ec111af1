"""The environment user code runs with, whichever way its sandbox came (a fresh one, a pool's, a zygote child)."""

from __future__ import annotations

from llm_sandbox_mcp.egress.relay import proxy_env
from llm_sandbox_mcp.languages import Language, sandbox_env
from llm_sandbox_mcp.models import SandboxSpec


def run_env(language: Language, spec: SandboxSpec) -> dict[str, str]:
    """What code runs with in a sandbox of `spec`: the language's variables (its library paths when the store
    is mounted), its own (`spec.env`) and, when the sandbox may reach the egress proxy (`spec.egress`), the
    proxy's."""
    proxy = proxy_env() if spec.egress else {}
    return {**sandbox_env(language, with_libraries=spec.cache is not None), **dict(spec.env), **proxy}
