"""The server name a TLS client asks for, read from the first bytes of a tunnel (its ClientHello).

A CONNECT is allowed by the name it asks for; behind one address a CDN serves many sites, chosen by the TLS
server name (SNI). Comparing that name with the CONNECT host keeps a tunnel opened for an allowed registry
from carrying a session with another site of the same CDN. Parsed strictly and bounded: the ClientHello may
span records (post-quantum key shares make it large), but not more than MAX_HELLO bytes in all.
"""

from __future__ import annotations

import asyncio

MAX_HELLO = 64 * 1024
_RECORD_HEADER = 5
_MAX_RECORD = 16384 + 2048  # a TLSCiphertext's largest length; a plaintext handshake record is smaller
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_HOST_NAME = 0


class NotAClientHello(ValueError):
    """The bytes are not a well-formed TLS ClientHello."""


def starts_tls(first: bytes) -> bool:
    """Whether a stream's first bytes open a TLS handshake record (SSL 3.0 to TLS 1.3 record versions)."""
    return len(first) >= 2 and first[0] == _HANDSHAKE and first[1] == 3


async def read_client_hello(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The records as read (to forward unchanged) and the ClientHello message they carry.

    Raises NotAClientHello, or asyncio.IncompleteReadError when the stream ends first."""
    records = bytearray()
    message = bytearray()
    while True:
        header = await reader.readexactly(_RECORD_HEADER)
        length = int.from_bytes(header[3:5], "big")
        if not starts_tls(header) or not 0 < length <= _MAX_RECORD:
            raise NotAClientHello("not a TLS handshake record")
        records += header + await reader.readexactly(length)
        message += records[-length:]
        if len(records) > MAX_HELLO:
            raise NotAClientHello(f"a ClientHello longer than {MAX_HELLO} bytes")
        if len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                raise NotAClientHello("the first handshake message is not a ClientHello")
            needed = 4 + int.from_bytes(message[1:4], "big")
            if needed > MAX_HELLO:
                raise NotAClientHello(f"a ClientHello longer than {MAX_HELLO} bytes")
            if len(message) >= needed:
                return bytes(records), bytes(message[:needed])


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, count: int) -> bytes:
        if count < 0 or self.at + count > len(self.data):
            raise NotAClientHello("a ClientHello cut short")
        chunk = self.data[self.at : self.at + count]
        self.at += count
        return chunk

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int) -> _Cursor:
        """A length-prefixed field (its length `size` bytes long), as a cursor of its own."""
        return _Cursor(self.take(self.number(size)))

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def server_name(hello: bytes) -> str | None:
    """The host name of a ClientHello's server_name extension (lowercase, no trailing dot), or None without one.

    Raises NotAClientHello when malformed: fields past their bounds, a repeated extension, a name not ASCII."""
    cursor = _Cursor(hello)
    if cursor.number(1) != _CLIENT_HELLO:
        raise NotAClientHello("not a ClientHello")
    body = cursor.vector(3)
    body.take(2 + 32)  # legacy_version, random
    body.vector(1)  # legacy_session_id
    body.vector(2)  # cipher_suites
    body.vector(1)  # legacy_compression_methods
    if body.done:
        return None  # no extensions at all
    extensions = body.vector(2)
    seen: set[int] = set()
    name: str | None = None
    while not extensions.done:
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind in seen:
            raise NotAClientHello("an extension given twice")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _host_name(data)
    return name


def _host_name(extension: _Cursor) -> str:
    names = extension.vector(2)
    found: list[str] = []
    while not names.done:
        kind = names.number(1)
        value = names.vector(2).data
        if kind == _HOST_NAME:
            try:
                found.append(value.decode("ascii").lower().removesuffix("."))
            except UnicodeDecodeError as exc:
                raise NotAClientHello("a server name that is not ASCII") from exc
    if len(found) != 1 or not found[0]:
        raise NotAClientHello("a server_name extension without exactly one host name")
    return found[0]
