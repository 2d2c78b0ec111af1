"""Putting a secret into a request to its bound host, at its bound place only, and taking it out of what comes
back. Pure functions over bytes: the intercepting proxy (`bound.py`) calls them, the unit tests too.

A placeholder is replaced only where it stands exactly as the declaration says: the whole value of the bound
header written in its format, the whole value of the bound query parameter, the whole string of the bound
top-level JSON field. Anywhere else in the request it stays what it is, a random token worth nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_plus

from llm_sandbox_mcp.egress.request import MAX_HEADERS, TOKEN
from llm_sandbox_mcp.secret_specs import SecretSpec

# A JSON body is read whole (to put a field in) up to this size; a larger one goes as it is.
MAX_JSON_BODY = 1024 * 1024
_HOP_BY_HOP = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization", b"te", b"upgrade", b"trailer"}
)


class BadInnerRequest(Exception):
    """A request inside an intercepted tunnel that this proxy does not serve; the message goes back."""


@dataclass(frozen=True)
class Binding:
    """A secret given to one session: its placeholder there, its value, and where and to whom it may go."""

    spec: SecretSpec
    placeholder: str
    value: str = field(repr=False)

    def binds(self, host: str, port: int) -> bool:
        return self.spec.bound_to(host, port)


@dataclass
class InnerRequest:
    """A request read from inside an intercepted tunnel: origin-form, HTTP/1.x."""

    method: bytes
    target: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]

    def header(self, name: bytes) -> bytes | None:
        found = [value for key, value in self.headers if key.lower() == name]
        return found[0] if found else None

    @property
    def content_length(self) -> int | None:
        length = self.header(b"content-length")
        return int(length) if length is not None else None

    @property
    def chunked(self) -> bool:
        return self.header(b"transfer-encoding") is not None


def parse_inner(head: bytes) -> InnerRequest:
    """Parse a request head read inside the tunnel. Raises BadInnerRequest."""
    if not head.endswith(b"\r\n\r\n"):
        raise BadInnerRequest("request head incomplete")
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not TOKEN.fullmatch(parts[0]) or parts[2] not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise BadInnerRequest("malformed request line")
    if not parts[1].startswith(b"/") or any(c in parts[1] for c in b"\0\r\n\t "):
        raise BadInnerRequest("the request target must be a path (origin form)")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadInnerRequest("too many headers")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not TOKEN.fullmatch(name) or any(c in value for c in b"\r\n\0"):
            raise BadInnerRequest("malformed header")
        headers.append((name, value.strip(b" \t")))
    request = InnerRequest(parts[0], parts[1], parts[2], headers)
    names = [name.lower() for name, _ in headers]
    if names.count(b"content-length") > 1 or names.count(b"host") > 1 or names.count(b"transfer-encoding") > 1:
        raise BadInnerRequest("repeated Content-Length, Transfer-Encoding or Host")
    if b"content-length" in names and b"transfer-encoding" in names:
        raise BadInnerRequest("both Transfer-Encoding and Content-Length")
    length = request.header(b"content-length")
    if length is not None and (not length.isdigit() or len(length) > 15):
        raise BadInnerRequest("malformed Content-Length")
    encoding = request.header(b"transfer-encoding")
    if encoding is not None and encoding.lower() != b"chunked":
        raise BadInnerRequest("only chunked Transfer-Encoding is served")
    return request


def host_matches(request: InnerRequest, host: str, port: int) -> bool:
    """Whether the request's Host names the tunnel's host (a request for another site of the same server, as
    behind a CDN, must not carry the secret there)."""
    value = request.header(b"host")
    if value is None:
        return request.version == b"HTTP/1.0"
    try:
        text = value.decode("ascii").lower().removesuffix(".")
    except UnicodeDecodeError:
        return False
    shown = f"[{host}]" if ":" in host else host
    return text in (shown, f"{shown}:{port}") or (port == 443 and text == f"{shown}:443")


def wants_json(request: InnerRequest, bindings: Sequence[Binding]) -> bool:
    """Whether the body must be read whole: a JSON field is bound and the body is JSON of a size we read."""
    kind = (request.header(b"content-type") or b"").split(b";")[0].strip().lower()
    is_json = kind == b"application/json" or kind.endswith(b"+json")
    length = request.content_length
    return (
        is_json
        and length is not None
        and 0 < length <= MAX_JSON_BODY
        and any(binding.spec.place.kind == "json_field" for binding in bindings)
    )


def substitute_target(target: bytes, bindings: Iterable[Binding]) -> bytes:
    """The request target with each bound query parameter whose whole value is its placeholder replaced."""
    path, mark, query = target.partition(b"?")
    if not mark:
        return target
    pairs = query.split(b"&")
    for binding in bindings:
        if binding.spec.place.kind != "query":
            continue
        for index, pair in enumerate(pairs):
            key, equals, value = pair.partition(b"=")
            if equals and value == binding.placeholder.encode() and _query_key(key) == binding.spec.place.name:
                pairs[index] = key + b"=" + quote(binding.value, safe="").encode()
    return path + b"?" + b"&".join(pairs)


def _query_key(key: bytes) -> str:
    return unquote_plus(key.decode("latin-1"))


def substitute_headers(headers: list[tuple[bytes, bytes]], bindings: Iterable[Binding]) -> list[tuple[bytes, bytes]]:
    """The headers with each bound header whose value is the format around its placeholder replaced."""
    result = list(headers)
    for binding in bindings:
        place = binding.spec.place
        if place.kind != "header":
            continue
        wanted = place.render(binding.placeholder).encode()
        for index, (name, value) in enumerate(result):
            if name.lower() == place.name.lower().encode() and value == wanted:
                result[index] = (name, place.render(binding.value).encode())
    return result


def substitute_json(body: bytes, bindings: Iterable[Binding]) -> bytes:
    """The JSON body with each bound top-level field whose value is its placeholder replaced; any other body
    (not an object, not JSON, no such field) unchanged."""
    try:
        document: object = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(document, dict):
        return body
    fields: dict[str, object] = document  # pyright: ignore[reportUnknownVariableType]
    changed = False
    for binding in bindings:
        place = binding.spec.place
        if place.kind == "json_field" and fields.get(place.name) == binding.placeholder:
            fields[place.name] = binding.value
            changed = True
    return json.dumps(fields).encode() if changed else body


def outgoing_head(request: InnerRequest, bindings: Sequence[Binding], body_length: int | None) -> bytes:
    """The head sent to the bound host: secrets in their places, hop-by-hop headers dropped, the response
    asked for uncompressed (so that a reflected value can be found in it) and the connection closed after it.
    `body_length` replaces Content-Length when the body was rewritten."""
    headers = substitute_headers(request.headers, bindings)
    kept: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower == b"accept-encoding":
            continue
        if body_length is not None and lower in (b"content-length", b"expect"):
            continue
        kept.append((name, value))
    if body_length is not None:
        kept.append((b"Content-Length", str(body_length).encode()))
    kept += [(b"Accept-Encoding", b"identity"), (b"Connection", b"close")]
    line = request.method + b" " + substitute_target(request.target, bindings) + b" " + request.version
    return line + b"\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in kept) + b"\r\n"


class Scrubber:
    """Masks every occurrence of the values in a stream of chunks (a bound host that echoes what it was sent
    must not hand the value to the sandbox). The mask has the value's length, so the response's framing
    (Content-Length, chunk sizes) stays right; a value split across chunks is found: the last bytes that may
    begin one are held back until the next chunk or the end."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = sorted({value.encode() for value in values if value}, key=len, reverse=True)
        self._keep = max((len(value) for value in self._values), default=1) - 1
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._mask(self._held + chunk)
        if self._keep == 0:
            self._held = b""
            return data
        self._held = data[-self._keep :]
        return data[: -self._keep] if len(data) > self._keep else b""

    def end(self) -> bytes:
        data, self._held = self._held, b""
        return data

    def _mask(self, data: bytes) -> bytes:
        for value in self._values:
            data = data.replace(value, b"*" * len(value))
        return data


def redact(text: str, bindings: Iterable[Binding]) -> str:
    """Text for the client with every value of `bindings` replaced by a marker naming its secret."""
    for binding in sorted(bindings, key=lambda b: len(b.value), reverse=True):
        if binding.value in text:
            text = text.replace(binding.value, f"[secret {binding.spec.name} redacted]")
    return text
