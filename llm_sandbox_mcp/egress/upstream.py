"""Chaining to the server's own proxy: HTTPS_PROXY / HTTP_PROXY / NO_PROXY of the server's environment."""

from __future__ import annotations

import base64
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from llm_sandbox_mcp.egress.request import Request


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int
    authorization: bytes = b""

    def connect_head(self, host: str, port: int) -> bytes:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n".encode() + self.authorization + b"\r\n"

    def with_credentials(self, head: bytes) -> bytes:
        line, _, rest = head.partition(b"\r\n")
        return line + b"\r\n" + self.authorization + rest


def bypassed(host: str, no_proxy: str) -> bool:
    """Whether NO_PROXY (`*`, or names and .suffixes, comma-separated, optional :port ignored) covers `host`."""
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        name = entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry
        name = name.strip("[]").lstrip("*").lstrip(".")
        if entry == "*" or (name and (host == name or host.endswith("." + name))):
            return True
    return False


def upstream_for(request: Request) -> Upstream | None:
    """The upstream proxy for this request, as the server's environment configures it, or None (direct)."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get("https" if request.tunnel else "http")
    if not url or bypassed(request.host, proxies.get("no", "")):
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.hostname is None:
        return None
    authorization = b""
    if parts.username is not None:
        token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode())
        authorization = b"Proxy-Authorization: Basic " + token + b"\r\n"
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return Upstream(parts.hostname, port, authorization)
