"""A proxy request's head, parsed strictly and bounded: CONNECT host:port, or an absolute http:// URI.

Everything here comes from a sandbox: anything unexpected is a BadRequest (answered 400, then closed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from llm_sandbox_mcp.host_rules import normalize_host

MAX_HEAD = 16 * 1024
MAX_HEADERS = 100
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
# Hop-by-hop headers, and the client's credentials for this proxy: never passed on.
_DROPPED = frozenset({b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization", b"upgrade", b"te"})


class BadRequest(Exception):
    """A request this proxy does not serve; the message is sent back to the client."""


@dataclass(frozen=True)
class Request:
    """A parsed request. `head` is what goes to the origin server (plain HTTP only), `absolute_head` what goes
    to an upstream proxy; both are b"" for CONNECT."""

    method: str
    host: str
    port: int
    head: bytes = b""
    absolute_head: bytes = b""

    @property
    def tunnel(self) -> bool:
        return self.method == "CONNECT"


def parse_head(data: bytes) -> Request:
    """Parse a request head (request line and headers, ending with an empty line)."""
    if len(data) > MAX_HEAD or not data.endswith(b"\r\n\r\n"):
        raise BadRequest("request head too large or incomplete")
    lines = data[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not TOKEN.fullmatch(parts[0]) or parts[2] not in _VERSIONS:
        raise BadRequest("malformed request line")
    method, target = parts[0].decode("ascii"), parts[1]
    headers = _headers(lines[1:])
    if method == "CONNECT":
        host, port = _authority(target, default_port=None)
        return Request(method, host, port)
    return _forwarded(method, target, parts[2], headers)


def _headers(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    if len(lines) > MAX_HEADERS:
        raise BadRequest("too many headers")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not TOKEN.fullmatch(name) or b"\r" in value or b"\n" in value or b"\0" in value:
            raise BadRequest("malformed header")
        headers.append((name, value.strip(b" \t")))
    names = [name.lower() for name, _ in headers]
    if b"transfer-encoding" in names and b"content-length" in names:
        raise BadRequest("both Transfer-Encoding and Content-Length")
    if names.count(b"content-length") > 1 or names.count(b"host") > 1:
        raise BadRequest("repeated Content-Length or Host")
    return headers


def _authority(target: bytes, default_port: int | None) -> tuple[str, int]:
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("target is not ASCII") from None
    if "@" in text or "/" in text or not text:
        raise BadRequest("malformed host")
    head, colon, tail = text.rpartition(":")
    if colon and (text.startswith("[") and head.endswith("]") or ":" not in head):
        host_text, port_text = head, tail
    elif default_port is not None:
        host_text, port_text = text, str(default_port)
    else:
        raise BadRequest("CONNECT needs host:port")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or len(port_text) > 5:
        raise BadRequest("malformed port")
    host = normalize_host(host_text)
    if host is None:
        raise BadRequest("malformed host")
    return host, int(port_text)


def _forwarded(method: str, target: bytes, version: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    if not target[:7].lower() == b"http://":
        raise BadRequest("a proxy request needs an absolute http:// URI (use CONNECT for https)")
    try:
        url = urlsplit(target.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("malformed URI") from None
    if any(c in target for c in b"\0\r\n\t "):
        raise BadRequest("malformed URI")
    host, port = _authority(url.netloc.encode(), default_port=80)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [(name, value) for name, value in headers if name.lower() not in _DROPPED and name.lower() != b"host"]
    authority = url.netloc.encode()
    fields = b"".join(name + b": " + value + b"\r\n" for name, value in kept)
    tail = b"Host: " + authority + b"\r\n" + fields + b"Connection: close\r\n\r\n"
    head = method.encode() + b" " + path.encode() + b" " + version + b"\r\n" + tail
    absolute = method.encode() + b" " + target + b" " + version + b"\r\n" + tail
    return Request(method, host, port, head, absolute)
