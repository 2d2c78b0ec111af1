"""The sandbox's end of the egress path: the relay on its loopback, and the variables that point every
package manager at it."""

from __future__ import annotations

import anyio

from llm_sandbox_mcp.backends import Backend, SandboxProcess
from llm_sandbox_mcp.egress.proxy import SOCKET_NAME
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.languages import runner_source
from llm_sandbox_mcp.models import EGRESS_DIR, SandboxRef, SandboxSpec

RELAY_PORT = 3128
_READY_SECONDS = 20.0


def proxy_env() -> dict[str, str]:
    """Proxy variables for pip, npm, Go, R and apt (libcurl and their own), gem, and Java's system properties.

    NO_PROXY is empty: a client that went direct would find nothing but the sandbox's own loopback.
    """
    url = f"http://127.0.0.1:{RELAY_PORT}"
    names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy", "npm_config_https_proxy")
    java = " ".join(f"-D{scheme}.proxyHost=127.0.0.1 -D{scheme}.proxyPort={RELAY_PORT}" for scheme in ("http", "https"))
    return {**dict.fromkeys(names, url), "NO_PROXY": "", "no_proxy": "", "JAVA_TOOL_OPTIONS": java}


def egress_env(spec: SandboxSpec) -> dict[str, str]:
    """The proxy variables for a sandbox that has the egress socket, else none."""
    return proxy_env() if spec.egress is not None else {}


async def relay_alive(relay: SandboxProcess) -> bool:
    """Whether the relay still runs (code in the sandbox, or a kill after a timeout, may have ended it)."""
    return await relay.receive(timeout=0) != b""


async def start_relay(backend: Backend, ref: SandboxRef) -> SandboxProcess:
    """Start the relay in the sandbox and wait until it listens. Raises SandboxFailure."""
    argv = ["perl", "-e", runner_source("egress_forward.pl"), str(EGRESS_DIR / SOCKET_NAME), str(RELAY_PORT)]
    relay = await backend.start(ref, argv)
    seen = b""
    with anyio.move_on_after(_READY_SECONDS):
        while b"ready\n" not in seen:
            chunk = await relay.receive(timeout=_READY_SECONDS)
            if not chunk:
                break
            seen += chunk
    if b"ready\n" not in seen:
        problem = relay.stderr_tail().decode("utf-8", errors="replace").strip()[-500:]
        await relay.aclose()
        raise SandboxFailure(f"the egress relay did not start in the sandbox (it needs perl): {problem or 'no answer'}")
    return relay
