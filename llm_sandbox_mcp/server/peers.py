"""The replicas of one service and what they trust of each other: a call about a session or a job another replica
holds is sent there (`server/forwarding.py`) with the caller's principal in a peer token, which the owner accepts
only when the secret the replicas share signed it.

A peer token is `lsp1.<sender>.<owner>.<principal, base64url>.<unix time>.<HMAC-SHA256, base64url>`, sent as the
request's bearer token. The secret itself never crosses the network; a token names one principal and one owner,
and is refused more than WINDOW seconds from its time (a replica's clock may be that far off). A client cannot
assert a principal: the only way to a principal is its own token, or a peer token that needs the shared secret.
The secrets file (SANDBOX_HTTP_PEER_SECRET_FILE) holds one secret a line; the first signs, any verifies, so a
secret is rotated by adding the new one second, then first, then removing the old one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import stat
import sys
import time
from pathlib import Path
from typing import cast

import httpx2
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken, TokenVerifier

from llm_sandbox_mcp.config import PEER_URL_FIELD, Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.replica_ids import REPLICA
from llm_sandbox_mcp.server.bearer_tokens import kubelet_secret
from llm_sandbox_mcp.server.oauth import OAuthConfig
from llm_sandbox_mcp.server.verifier import vouched

logger = logging.getLogger(__name__)

SETTING = "SANDBOX_HTTP_PEER_SECRET_FILE"
VERSION = "lsp1"
# Seconds a peer token is good for, either side of its time.
WINDOW = 60
MIN_SECRET_LENGTH = 32
MAX_SECRET_LENGTH = 512
MAX_FILE_BYTES = 64 * 1024
# A principal as the verifiers make them: a tokens file's name, or an OAuth subject (server/oauth.py).
MAX_PRINCIPAL_LENGTH = 255
# How long a replica has to accept a forwarded call's connection.
CONNECT_SECONDS = 5.0
# Beyond the longest a call may run at its owner (a cell, a job's long poll): the request and its answer.
DEADLINE_MARGIN = 60.0


def _refuse(path: Path, problem: str) -> ConfigError:
    return ConfigError([f"{SETTING} ({path}): {problem}"])


def _private(info: os.stat_result) -> bool:
    """Readable by its owner only, or a Secret a kubelet mounted (as for SANDBOX_HTTP_TOKENS_FILE, docs/http.md)."""
    if sys.platform == "win32":
        return True
    return not stat.S_IMODE(info.st_mode) & 0o077 or kubelet_secret(info)


def load_secrets(path: Path) -> tuple[bytes, ...]:
    """The shared secrets, the signing one first; ConfigError naming the file and the line at fault (never a
    secret)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, "is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise _refuse(path, f"is larger than {MAX_FILE_BYTES} bytes; it should hold one short line per secret")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise _refuse(path, f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8 text") from None
    if not _private(info):
        raise _refuse(
            path,
            f"is readable or writable by others than its owner (mode {stat.S_IMODE(info.st_mode):04o}); make it "
            f"private with: chmod 600 {path}",
        )
    found: list[bytes] = []
    for number, line in enumerate(text.splitlines(), start=1):
        secret = line.strip()
        if not secret or secret.startswith("#"):
            continue
        if not MIN_SECRET_LENGTH <= len(secret) <= MAX_SECRET_LENGTH or not secret.isascii() or " " in secret:
            raise _refuse(
                path,
                f"line {number}: a secret must be {MIN_SECRET_LENGTH} to {MAX_SECRET_LENGTH} ASCII characters without "
                "blanks (make one with: openssl rand -hex 32)",
            )
        found.append(secret.encode())
    if not found:
        raise _refuse(path, "holds no secret; put the same one, made with `openssl rand -hex 32`, on every replica")
    return tuple(found)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, sender: str, owner: str, principal: str, when: str) -> bytes:
    message = "\n".join((VERSION, sender, owner, principal, when)).encode()
    return hmac.new(secret, message, hashlib.sha256).digest()


class PeerAccess(AccessToken):
    """A principal's access, asserted by another replica (`via`) with the shared secret: the call it carries
    was forwarded once, and is never forwarded again."""

    via: str


def forwarded_by_peer(request: object) -> bool:
    """Whether `request` (the SDK's HTTP request of a call) came from another replica with a peer token."""
    scope: object = getattr(request, "scope", None)
    user = cast("dict[str, object]", scope).get("user") if isinstance(scope, dict) else None
    return isinstance(user, AuthenticatedUser) and isinstance(user.access_token, PeerAccess)


class Peers:
    """This replica's id, the way to another replica, the shared secrets, and the one HTTP client forwarded
    calls go through (closed by `aclose`)."""

    def __init__(self, replica: str, url_template: str, secrets: tuple[bytes, ...], deadline: float) -> None:
        self.replica = replica
        self.url_template = url_template
        self.secrets = secrets
        self.deadline = deadline
        self._http: httpx2.AsyncClient | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Peers | None:
        """None for a server that is not one of several replicas (config.py checked the three settings go
        together)."""
        if settings.sandbox_http_replica_id is None:
            return None
        assert settings.sandbox_http_peer_url is not None and settings.sandbox_http_peer_secret_file is not None
        longest = max(settings.sandbox_max_timeout, settings.sandbox_foreground_limit)
        return cls(
            settings.sandbox_http_replica_id,
            settings.sandbox_http_peer_url,
            load_secrets(settings.sandbox_http_peer_secret_file),
            longest + DEADLINE_MARGIN,
        )

    def url_of(self, replica: str) -> str:
        return self.url_template.replace(PEER_URL_FIELD, replica).rstrip("/") + "/mcp"

    @property
    def http(self) -> httpx2.AsyncClient:
        if self._http is None:
            # The deadline of a whole call is Forwarder's; here only how long a connection may take.
            self._http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(None, connect=CONNECT_SECONDS), follow_redirects=False
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def token_for(self, principal: str, owner: str, now: float | None = None) -> str:
        """The bearer token that asserts `principal` to the replica `owner`."""
        when = str(int(time.time() if now is None else now))
        mac = _mac(self.secrets[0], self.replica, owner, principal, when)
        return ".".join((VERSION, self.replica, owner, _b64(principal.encode()), when, _b64(mac)))

    def verify(self, token: str, now: float | None = None) -> tuple[str, str] | None:
        """(principal, sender) of a peer token this replica accepts; None for one it refuses (logged, without the
        token), and for a token that is not a peer token at all."""
        fields = token.split(".")
        if len(fields) != 6 or fields[0] != VERSION:
            return None
        _, sender, owner, encoded, when, signature = fields
        try:
            principal = _unb64(encoded).decode()
            mac = _unb64(signature)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            logger.warning("Refused a peer token: it is malformed")
            return None
        if not REPLICA.fullmatch(sender) or not when.isdigit():
            logger.warning("Refused a peer token: it is malformed")
            return None
        if owner != self.replica:
            logger.warning("Refused a peer token from %s: it was made for another replica", sender)
            return None
        if not 0 < len(principal) <= MAX_PRINCIPAL_LENGTH or not principal.isprintable() or " " in principal:
            logger.warning("Refused a peer token from %s: its principal is not a principal's name", sender)
            return None
        matched = False
        for secret in self.secrets:
            # Every secret is compared, a match or not.
            matched |= hmac.compare_digest(_mac(secret, sender, owner, principal, when), mac)
        if not matched:
            logger.warning(
                "Refused a peer token from %s: no secret of %s signed it (every replica needs the same file)",
                sender,
                SETTING,
            )
            return None
        if abs((time.time() if now is None else now) - int(when)) > WINDOW:
            logger.warning(
                "Refused a peer token from %s: its time is more than %d s from this replica's clock", sender, WINDOW
            )
            return None
        return principal, sender


class PeerVerifier:
    """The SDK's TokenVerifier over HTTP when serving as one of several replicas: a peer token is checked here,
    any other token by `inner` (the tokens file, OAuth, or both: server/verifier.py)."""

    def __init__(self, peers: Peers, inner: TokenVerifier, oauth: OAuthConfig | None) -> None:
        self.peers = peers
        self.inner = inner
        self.oauth = oauth

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token.startswith(VERSION + ".") or token.count(".") != 5:
            return await self.inner.verify_token(token)
        verified = self.peers.verify(token)
        if verified is None:
            return None
        principal, sender = verified
        # The principal's own token passed this server's checks at the sender.
        return PeerAccess(**vouched(token, principal, self.oauth).model_dump(), via=sender)
