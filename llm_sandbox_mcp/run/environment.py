"""The environment user code runs with, whichever way its sandbox came (a fresh one, a pool's, a zygote child)."""

from __future__ import annotations

from llm_sandbox_mcp.egress.relay import proxy_env
from llm_sandbox_mcp.languages import Language, sandbox_env
from llm_sandbox_mcp.models import SandboxSpec

JAVA = "JAVA_TOOL_OPTIONS"


def run_env(language: Language, spec: SandboxSpec) -> dict[str, str]:
    """What code runs with in a sandbox of `spec`: the language's variables (its library paths when the store
    is mounted), its own (`spec.env`) and, when the sandbox may reach the egress proxy (`spec.egress`), the
    proxy's."""
    proxy = proxy_env() if spec.egress else {}
    own = dict(spec.env)
    env = {**sandbox_env(language, with_libraries=spec.cache is not None), **own, **proxy}
    # The JVM takes its proxy and its trust store (a session's secrets) from one variable: both, when both are set.
    java = " ".join(dict.fromkeys(part for part in (own.get(JAVA), proxy.get(JAVA)) if part))
    if java:
        env[JAVA] = java
    return env
