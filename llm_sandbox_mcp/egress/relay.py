"""The sandbox's end of the egress path: the relay on its loopback, whose connections a tunnel carries over its
own stream to the proxy, and the variables that point every package manager at it."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from llm_sandbox_mcp.backends import Backend, SandboxProcess
from llm_sandbox_mcp.egress.proxy import EgressListener
from llm_sandbox_mcp.egress.tunnel import MAX_PAYLOAD, Tunnel, Tunnels
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.languages import runner_source
from llm_sandbox_mcp.models import SandboxRef

RELAY_PORT = 3128
_READY_SECONDS = 20.0
_READY = b"ready\n"


def proxy_env() -> dict[str, str]:
    """Proxy variables for pip, npm, Go, R and apt (libcurl and their own), gem, and Java's system properties.

    NO_PROXY is empty: a client that went direct would find nothing but the sandbox's own loopback.
    """
    url = f"http://127.0.0.1:{RELAY_PORT}"
    names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy", "npm_config_https_proxy")
    java = " ".join(f"-D{scheme}.proxyHost=127.0.0.1 -D{scheme}.proxyPort={RELAY_PORT}" for scheme in ("http", "https"))
    return {**dict.fromkeys(names, url), "NO_PROXY": "", "no_proxy": "", "JAVA_TOOL_OPTIONS": java}


@dataclass
class Relay:
    """The relay running in a sandbox, and the tunnel that carries its connections."""

    process: SandboxProcess
    tunnel: Tunnel

    async def aclose(self) -> None:
        """Close the tunnel and the relay's stream. Does not wait for the process; a kill or destroy ends it."""
        await self.tunnel.aclose()


async def relay_alive(relay: Relay) -> bool:
    """Whether the relay still runs (code in the sandbox, or a kill after a timeout, may have ended it)."""
    return await relay.tunnel.alive()  # its output is the tunnel's to read


async def start_relay(backend: Backend, ref: SandboxRef, listener: EgressListener, tunnels: Tunnels) -> Relay:
    """Start the relay in the sandbox, wait until it listens, and carry its connections to `listener` through a
    tunnel of `tunnels`. Raises SandboxFailure."""
    argv = ["perl", "-e", runner_source("egress_forward.pl"), "--", str(RELAY_PORT)]
    process = await backend.start(ref, argv)
    seen = b""
    with anyio.move_on_after(_READY_SECONDS):
        while _READY not in seen:
            chunk = await process.receive(timeout=_READY_SECONDS)
            if not chunk:
                break
            seen += chunk
            if len(seen) > 2 * MAX_PAYLOAD:
                break  # not a relay that started: nothing says how much more to wait for
    if _READY not in seen:
        problem = process.stderr_tail().decode("utf-8", errors="replace").strip()[-500:]
        await process.aclose()
        raise SandboxFailure(f"the egress relay did not start in the sandbox (it needs perl): {problem or 'no answer'}")
    try:
        tunnel = await tunnels.open(process, listener.connect, listener.label, seen.split(_READY, 1)[1])
    except BaseException:
        with anyio.CancelScope(shield=True):
            await process.aclose()
        raise
    return Relay(process, tunnel)
