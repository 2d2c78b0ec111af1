"""`serve --http HOST:PORT`: the same server over the MCP SDK's streamable HTTP, at /mcp, behind bearer tokens.

Stateless: the SDK keeps no MCP session between requests (every protocol generation is served per request,
the 2026-07-28 one as the protocol defines it, the earlier ones in the SDK's stateless mode), so nothing of
the transport ties a client to this process. What does live in this process is the sandboxes' state:
sessions, jobs and their files (docs/http.md says what a restart loses).
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.settings import AuthSettings
from starlette.applications import Starlette

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.bearer_tokens import SETTING, FileTokenVerifier, TokenFile
from llm_sandbox_mcp.server.call_gate import CallGate, audit_log
from llm_sandbox_mcp.server.state import AppState

logger = logging.getLogger(__name__)

PATH = "/mcp"
UNAUTHENTICATED_FLAG = "--allow-unauthenticated-loopback"
# How long a stop waits for calls in progress before it cancels them (their sandboxes are removed either way).
GRACE_SECONDS = 10


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a name other than localhost may resolve anywhere


def parse_listen(text: str) -> Listen:
    """HOST:PORT, with an IPv6 address in brackets ([::1]:8000)."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host and not text[0] == "["):
        raise ConfigError(
            [f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8000, 0.0.0.0:8000 or [::1]:8000 (port 1-65535)"]
        )
    return Listen(host, int(port))


def check_authentication(settings: Settings, listen: Listen, unauthenticated_loopback: bool) -> TokenFile | None:
    """The tokens to serve with, or None where serving without is allowed; else ConfigError saying what to do."""
    if settings.sandbox_http_tokens_file is not None:
        return TokenFile.load(settings.sandbox_http_tokens_file)
    if not listen.loopback:
        raise ConfigError(
            [
                f"refusing to serve HTTP on {listen.host}, which is not a loopback address, without authentication: "
                f"set {SETTING} to a file of `principal token` lines (see docs/http.md)"
            ]
        )
    if not unauthenticated_loopback:
        raise ConfigError(
            [
                f"refusing to serve HTTP without authentication: set {SETTING} to a file of `principal token` lines "
                f"(see docs/http.md), or pass {UNAUTHENTICATED_FLAG} to let every process and user of this machine "
                "call it as one principal"
            ]
        )
    return None


def build_app(settings: Settings, state: AppState, listen: Listen, tokens: TokenFile | None) -> Starlette:
    """The ASGI app: the SDK's streamable-HTTP app of our server, its token verifier and our call gate."""
    from llm_sandbox_mcp.server.app import build_server

    auth: dict[str, Any] = {}
    if tokens is not None:
        auth = {
            "token_verifier": FileTokenVerifier(tokens),
            # The SDK wants an issuer; with a tokens file this server is its own (no OAuth routes are served
            # without a provider, and no resource metadata without resource_server_url).
            "auth": AuthSettings(issuer_url=listen.url, resource_server_url=None),  # pyright: ignore[reportArgumentType]
        }
    server = build_server(
        settings, state=state, middleware=[CallGate(settings.sandbox_http_max_calls_per_principal)], **auth
    )
    return server.streamable_http_app(
        streamable_http_path=PATH,
        stateless_http=True,
        max_request_body_size=settings.sandbox_http_max_body,
        host=listen.host,
    )


async def serve_http(settings: Settings, listen: Listen, tokens: TokenFile | None) -> None:
    """Serve until SIGINT, SIGTERM or SIGHUP: calls in progress get GRACE_SECONDS, then every sandbox goes."""
    import uvicorn

    state = AppState(settings, over_http=True)
    app = build_app(settings, state, listen, tokens)
    try:
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        sock = socket.create_server((listen.host, listen.port), family=family)
    except OSError as exc:
        raise ConfigError([f"--http {listen.host}:{listen.port}: cannot listen there: {exc.strerror or exc}"]) from None
    audit_log.setLevel(logging.INFO)  # the audit trail stays on whatever SANDBOX_LOG_LEVEL says
    config = uvicorn.Config(
        app,
        log_config=None,  # uvicorn's loggers go where ours do: stderr
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=GRACE_SECONDS,
    )
    server = uvicorn.Server(config)
    if sys.platform != "win32":
        # uvicorn stops on SIGINT and SIGTERM; a hang-up stops the same way.
        def hang_up(_signal: int, _frame: object) -> None:
            server.should_exit = True

        signal.signal(signal.SIGHUP, hang_up)
    if tokens is not None:
        principals = ", ".join(tokens.principals)
        logger.info("Serving MCP over HTTP at %s%s for %s (%s)", listen.url, PATH, principals, SETTING)
    else:
        logger.warning(
            "Serving MCP over HTTP at %s%s WITHOUT authentication (%s): every process and user of this machine "
            "can call it, as one principal",
            listen.url,
            PATH,
            UNAUTHENTICATED_FLAG,
        )
    await server.serve(sockets=[sock])
