"""An OAuth authorization server double on loopback: it issues access tokens (to the test, in-process, with
whatever claims the test asks for) and introspects them over real HTTP (RFC 7662), with its RFC 8414 metadata.
It also mints JWT access tokens (RFC 9068), signed here with `cryptography` (not with the library the server
verifies with), and serves its public keys as a JWKS (RFC 7517) at /jwks; and it forges the tokens an attacker
would (`alg: none`, an HMAC keyed with the public key, a key of the attacker's own).

It is lax on purpose: a token it issued is `active` until revoked, whatever its expiry, audience or issuer say,
so what a test sees is the protected resource's own checks, not the double's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

CLIENT_ID = "sandbox-mcp"
CLIENT_SECRET = "resource-server-secret-" + "5e" * 8
SigningKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _number(value: int) -> str:
    return _b64(value.to_bytes((value.bit_length() + 7) // 8 or 1, "big"))


@cache
def _rsa_key(name: str) -> rsa.RSAPrivateKey:
    """One 2048-bit key per name for the whole test run (a new one takes a while)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _first_keys() -> dict[str, SigningKey]:
    return {"rsa-1": _rsa_key("rsa-1"), "ec-1": ec.generate_private_key(ec.SECP256R1())}


def public_jwk(kid: str, key: SigningKey) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        numbers = key.public_key().public_numbers()
        return {"kty": "RSA", "kid": kid, "use": "sig", "n": _number(numbers.n), "e": _number(numbers.e)}
    point = key.public_key().public_numbers()
    return {"kty": "EC", "kid": kid, "use": "sig", "crv": "P-256", "x": _b64(point.x.to_bytes(32, "big")),
            "y": _b64(point.y.to_bytes(32, "big"))}  # fmt: skip


def public_pem(key: SigningKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def sign(header: dict[str, Any], claims: dict[str, Any], key: SigningKey | bytes | None) -> str:
    """A compact JWS: RS256 or PS256 with an RSA key, ES256 with an EC one, HS256 with bytes, nothing with None."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}".encode()
    alg = header.get("alg")
    if key is None:
        signature = b""
    elif isinstance(key, bytes):
        signature = hmac.new(key, signing_input, hashlib.sha256).digest()
    elif isinstance(key, rsa.RSAPrivateKey):
        pad = padding.PKCS1v15() if alg != "PS256" else padding.PSS(padding.MGF1(hashes.SHA256()), 32)
        signature = key.sign(signing_input, pad, hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return f"{signing_input.decode()}.{_b64(signature)}"


@dataclass
class AuthorizationServer:
    url: str = ""
    tokens: dict[str, dict[str, Any]] = field(default_factory=lambda: {})
    # Every token the introspection endpoint was asked about, in order.
    introspected: list[str] = field(default_factory=lambda: [])
    # When set, the introspection endpoint answers this HTTP status with `failing_body`, and nothing else.
    failing: int | None = None
    failing_body: str = '{"error": "server_error"}'
    # Seconds the introspection endpoint takes to answer (the handler's thread sleeps).
    delay: float = 0.0
    # The signing keys the JWKS publishes, by key id; how many times it was fetched; when set, what /jwks answers
    # instead (an HTTP status and a body).
    keys: dict[str, SigningKey] = field(default_factory=lambda: _first_keys())
    jwks_fetches: int = 0
    jwks_answer: tuple[int, str] | None = None
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
        self.tokens[token] = self.claims(subject, audience, scope, **{"token_type": "Bearer", "jti": None, **claims})
        return token

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks"

    def jwks(self) -> dict[str, Any]:
        self.jwks_fetches += 1
        return {"keys": [public_jwk(kid, key) for kid, key in self.keys.items()]}

    def claims(
        self, subject: str | None, audience: str | list[str] | None, scope: str = "", **claims: Any
    ) -> dict[str, Any]:
        """The claims of an access token; `claims` add to or override (None removes) the usual ones."""
        now = int(time.time())
        base: dict[str, Any] = {
            "iss": self.issuer, "sub": subject, "aud": audience, "scope": scope, "client_id": "a-client",
            "iat": now, "exp": now + 3600, "jti": secrets.token_hex(8),
        }  # fmt: skip
        base.update(claims)
        return {key: value for key, value in base.items() if value is not None}

    def mint(
        self,
        subject: str | None,
        audience: str | list[str] | None,
        scope: str = "",
        *,
        kid: str | None = "rsa-1",
        alg: str | None = None,
        key: SigningKey | bytes | None = None,
        header: dict[str, Any] | None = None,
        **claims: Any,
    ) -> str:
        """A JWT access token signed with key `kid` (or `key`, which is then what signs: forgeries); a `kid` the
        double has no key of names a token that its first key signed."""
        genuine = self.keys.get(kid or "", self.keys["rsa-1"])
        signer: SigningKey | bytes | None = key if key is not None or alg == "none" else genuine
        if alg is None:
            alg = "RS256" if isinstance(signer, rsa.RSAPrivateKey) else "ES256"
        base: dict[str, Any] = {"alg": alg, "typ": "at+jwt", "kid": kid}
        base.update(header or {})
        return sign(
            {k: v for k, v in base.items() if v is not None}, self.claims(subject, audience, scope, **claims), signer
        )

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
            if self.path == "/jwks":
                if double.jwks_answer is not None:
                    double.jwks_fetches += 1  # counted before the answer goes: the test may look at once
                    status, body = double.jwks_answer
                    data = body.encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._send(200, double.jwks())
                return
            if self.path != "/.well-known/oauth-authorization-server":
                self._send(404, {"error": "not_found"})
                return
            self._send(
                200,
                {
                    "issuer": double.issuer,
                    "introspection_endpoint": double.introspection_url,
                    "jwks_uri": double.jwks_url,
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
            time.sleep(double.delay)
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
