"""`serve --http HOST:PORT`: the same server over the MCP SDK's streamable HTTP, at /mcp, behind bearer tokens
(a tokens file, OAuth access tokens, or both).

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
from typing import TYPE_CHECKING, Any

from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.routes import create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.bearer_tokens import SETTING, TokenFile
from llm_sandbox_mcp.server.call_gate import CallGate, audit_log
from llm_sandbox_mcp.server.forwarding import Forwarder
from llm_sandbox_mcp.server.health import health_routes
from llm_sandbox_mcp.server.oauth import OAuthConfig, unavailable_response
from llm_sandbox_mcp.server.peers import Peers, PeerVerifier
from llm_sandbox_mcp.server.state import AppState
from llm_sandbox_mcp.server.verifier import Verifier

if TYPE_CHECKING:
    import uvicorn
    from mcp.server.context import ServerMiddleware

    from llm_sandbox_mcp.backends import Backend

logger = logging.getLogger(__name__)

PATH = "/mcp"
UNAUTHENTICATED_FLAG = "--allow-unauthenticated-loopback"
OAUTH_SETTINGS = "SANDBOX_HTTP_OAUTH_ISSUER, _RESOURCE and _INTROSPECTION_URL or _JWKS_URL"
ROOT_METADATA_PATH = "/.well-known/oauth-protected-resource"
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


@dataclass(frozen=True)
class Authentication:
    """How requests are authenticated: a tokens file, an OAuth authorization server, both, or (loopback) neither;
    and, for one of several replicas, the other replicas' calls (server/peers.py)."""

    tokens: TokenFile | None = None
    oauth: OAuthConfig | None = None
    peers: Peers | None = None

    @property
    def enabled(self) -> bool:
        return self.tokens is not None or self.oauth is not None


def check_authentication(settings: Settings, listen: Listen, unauthenticated_loopback: bool) -> Authentication:
    """How to authenticate (none where serving without is allowed); else ConfigError saying what to do."""
    tokens = None
    if settings.sandbox_http_tokens_file is not None:
        tokens = TokenFile.load(settings.sandbox_http_tokens_file)
    authentication = Authentication(tokens, OAuthConfig.from_settings(settings), Peers.from_settings(settings))
    if authentication.enabled:
        return authentication
    if authentication.peers is not None:
        raise ConfigError(
            [
                f"SANDBOX_HTTP_REPLICA_ID is set without authentication: replicas need {SETTING} or "
                f"{OAUTH_SETTINGS}, so that each call has a principal to forward"
            ]
        )
    if not listen.loopback:
        raise ConfigError(
            [
                f"refusing to serve HTTP on {listen.host}, which is not a loopback address, without authentication: "
                f"set {SETTING} to a file of `principal token` lines, or {OAUTH_SETTINGS} (see docs/http.md)"
            ]
        )
    if not unauthenticated_loopback:
        raise ConfigError(
            [
                f"refusing to serve HTTP without authentication: set {SETTING} to a file of `principal token` lines "
                f"or {OAUTH_SETTINGS} (see docs/http.md), or pass {UNAUTHENTICATED_FLAG} to let every process and "
                "user of this machine call it as one principal"
            ]
        )
    return authentication


def _auth_settings(listen: Listen, oauth: OAuthConfig | None) -> AuthSettings:
    if oauth is None:
        # The SDK wants an issuer; with a tokens file alone this server is its own (no OAuth routes are served
        # without a provider, and no resource metadata without resource_server_url).
        return AuthSettings(issuer_url=listen.url, resource_server_url=None)  # pyright: ignore[reportArgumentType]
    return AuthSettings(
        issuer_url=oauth.issuer,  # pyright: ignore[reportArgumentType]
        resource_server_url=oauth.resource,  # pyright: ignore[reportArgumentType]
        required_scopes=list(oauth.scopes) or None,
        # The SDK compares the token's audience (AccessToken.resource) with the resource URL.
        validate_token_resource=True,
    )


def _answer_unavailable_with_503(app: Starlette) -> None:
    """The SDK's authentication middleware answers a verifier's AuthenticationError with a bare 400; a token the
    authorization server could not verify gets 503 and Retry-After instead (server/oauth.py)."""
    for middleware in app.user_middleware:
        if middleware.cls is AuthenticationMiddleware:
            middleware.kwargs["on_error"] = unavailable_response


def _root_metadata_route(oauth: OAuthConfig) -> Route:
    """The protected resource metadata at the root well-known address too, for clients that look there only
    (the SDK serves it at /.well-known/oauth-protected-resource/mcp, RFC 9728's address for /mcp)."""
    route = create_protected_resource_routes(
        resource_url=AnyHttpUrl(oauth.resource),
        authorization_servers=[AnyHttpUrl(oauth.issuer)],
        scopes_supported=list(oauth.scopes) or None,
    )[0]
    return Route(ROOT_METADATA_PATH, endpoint=route.endpoint, methods=["GET", "OPTIONS"])


def build_app(
    settings: Settings,
    state: AppState,
    listen: Listen,
    authentication: Authentication,
    backend: Backend | None = None,
) -> tuple[Starlette, Verifier | None]:
    """The ASGI app: the SDK's streamable-HTTP app of our server, its token verifier and our call gate, and the
    probes (server/health.py); and the verifier, to close when serving ends. `backend` replaces the configured
    engine (tests pass a fake)."""
    from llm_sandbox_mcp.server.app import build_server

    auth: dict[str, Any] = {}
    verifier = None
    routes: list[Route] = health_routes(state)
    middleware: list[ServerMiddleware[Any]] = [CallGate(settings.sandbox_http_max_calls_per_principal)]
    if authentication.enabled:
        verifier = Verifier(authentication.tokens, authentication.oauth)
        token_verifier: TokenVerifier = verifier
        if authentication.peers is not None:
            token_verifier = PeerVerifier(authentication.peers, verifier, authentication.oauth)
            middleware.insert(0, Forwarder(authentication.peers))
        auth = {"token_verifier": token_verifier, "auth": _auth_settings(listen, authentication.oauth)}
        if authentication.oauth is not None:
            routes.append(_root_metadata_route(authentication.oauth))
    server = build_server(
        settings,
        backend,
        state=state,
        middleware=middleware,
        **auth,
    )
    app = server.streamable_http_app(
        streamable_http_path=PATH,
        stateless_http=True,
        max_request_body_size=settings.sandbox_http_max_body,
        host=listen.host,
    )
    app.router.routes.extend(routes)
    _answer_unavailable_with_503(app)
    return app, verifier


def uvicorn_config(app: Starlette, settings: Settings) -> uvicorn.Config:
    """How uvicorn serves the app: HTTP/1.1 with the bounds on slow clients and open connections
    (server/connections.py), its logs where ours go, no Server header, a grace for calls at a stop."""
    import uvicorn

    from llm_sandbox_mcp.server.connections import bounded_protocol

    return uvicorn.Config(
        app,
        http=bounded_protocol(settings.sandbox_http_request_timeout, settings.sandbox_http_max_connections),
        log_config=None,  # uvicorn's loggers go where ours do: stderr
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=GRACE_SECONDS,
    )


async def serve_http(settings: Settings, listen: Listen, authentication: Authentication) -> None:
    """Serve until SIGINT, SIGTERM or SIGHUP: calls in progress get GRACE_SECONDS, then every sandbox goes."""
    import uvicorn

    state = AppState(settings, over_http=True)
    app, verifier = build_app(settings, state, listen, authentication)
    try:
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        sock = socket.create_server((listen.host, listen.port), family=family)
    except OSError as exc:
        raise ConfigError([f"--http {listen.host}:{listen.port}: cannot listen there: {exc.strerror or exc}"]) from None
    audit_log.setLevel(logging.INFO)  # the audit trail stays on whatever SANDBOX_LOG_LEVEL says
    config = uvicorn_config(app, settings)
    server = uvicorn.Server(config)
    if sys.platform != "win32":
        # uvicorn stops on SIGINT and SIGTERM; a hang-up stops the same way.
        def hang_up(_signal: int, _frame: object) -> None:
            server.should_exit = True

        signal.signal(signal.SIGHUP, hang_up)
    if authentication.tokens is not None:
        principals = ", ".join(authentication.tokens.principals)
        logger.info("Serving MCP over HTTP at %s%s for %s (%s)", listen.url, PATH, principals, SETTING)
    if authentication.oauth is not None:
        oauth = authentication.oauth
        logger.info(
            "Serving MCP over HTTP at %s%s as the OAuth protected resource %s, for tokens of %s",
            listen.url,
            PATH,
            oauth.resource,
            oauth.issuer,
        )
    if not authentication.enabled:
        logger.warning(
            "Serving MCP over HTTP at %s%s WITHOUT authentication (%s): every process and user of this machine "
            "can call it, as one principal",
            listen.url,
            PATH,
            UNAUTHENTICATED_FLAG,
        )
    if authentication.peers is not None:
        peers = authentication.peers
        logger.info(
            "Serving as replica %s: calls about another replica's sessions and jobs go to %s",
            peers.replica,
            peers.url_template,
        )
    try:
        await server.serve(sockets=[sock])
    finally:
        if verifier is not None:
            await verifier.aclose()
        if authentication.peers is not None:
            await authentication.peers.aclose()
