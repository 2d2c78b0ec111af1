"""An OAuth authorization server double on loopback: it issues access tokens (to the test, in-process, with
whatever claims the test asks for) and introspects them over real HTTP (RFC 7662), with its RFC 8414 metadata.

It is lax on purpose: a token it issued is `active` until revoked, whatever its expiry, audience or issuer say,
so what a test sees is the protected resource's own checks, not the double's.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

CLIENT_ID = "sandbox-mcp"
CLIENT_SECRET = "resource-server-secret-" + "5e" * 8


@dataclass
class AuthorizationServer:
    url: str = ""
    tokens: dict[str, dict[str, Any]] = field(default_factory=lambda: {})
    # Every token the introspection endpoint was asked about, in order.
    introspected: list[str] = field(default_factory=lambda: [])
    # When set, the introspection endpoint answers this HTTP status with `failing_body`, and nothing else.
    failing: int | None = None
    failing_body: str = '{"error": "server_error"}'
    _server: ThreadingHTTPServer | None = None

    @property
    def issuer(self) -> str:
        return self.url

    @property
    def introspection_url(self) -> str:
        return f"{self.url}/introspect"

    def issue(self, subject: str | None, audience: str | list[str] | None, scope: str = "", **claims: Any) -> str:
        """A new access token; `claims` add to or override (None removes) the usual ones."""
        token = secrets.token_urlsafe(32)
        now = int(time.time())
        base: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "scope": scope,
            "client_id": "a-client",
            "iat": now,
            "exp": now + 3600,
            "token_type": "Bearer",
        }
        base.update(claims)
        self.tokens[token] = {key: value for key, value in base.items() if value is not None}
        return token

    def revoke(self, token: str) -> None:
        self.tokens.pop(token, None)

    def introspect(self, token: str) -> dict[str, Any]:
        self.introspected.append(token)
        claims = self.tokens.get(token)
        return {"active": False} if claims is None else {"active": True, **claims}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _handler(double: AuthorizationServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path != "/.well-known/oauth-authorization-server":
                self._send(404, {"error": "not_found"})
                return
            self._send(
                200,
                {
                    "issuer": double.issuer,
                    "introspection_endpoint": double.introspection_url,
                    "introspection_endpoint_auth_methods_supported": ["client_secret_basic"],
                    "response_types_supported": ["code"],
                },
            )

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            if self.path != "/introspect":
                self._send(404, {"error": "not_found"})
                return
            if double.failing is not None:
                body = double.failing_body.encode()
                self.send_response(double.failing)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            expected = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
            if self.headers.get("Authorization") != f"Basic {expected}":
                self._send(401, {"error": "invalid_client"})
                return
            if self.headers.get("Content-Type", "").split(";")[0] != "application/x-www-form-urlencoded":
                self._send(400, {"error": "invalid_request"})
                return
            self._send(200, double.introspect(form.get("token", [""])[0]))

    return Handler


@contextmanager
def authorization_server() -> Generator[AuthorizationServer]:
    """The double, serving on a free loopback port until the block ends."""
    double = AuthorizationServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(double))
    server.daemon_threads = True
    double.url = f"http://127.0.0.1:{server.server_address[1]}"
    double._server = server  # pyright: ignore[reportPrivateUsage]
    thread = threading.Thread(target=server.serve_forever, name="authorization-server", daemon=True)
    thread.start()
    try:
        yield double
    finally:
        double.stop()
        thread.join(timeout=10)
