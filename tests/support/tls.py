"""TLS as a real client speaks it, for the egress proxy's tests."""

from __future__ import annotations

import ssl

import pytest


def client_hello(host: str | None) -> bytes:
    """The first flight of a real TLS client connecting to `host` (no server name when None)."""
    context = ssl.create_default_context()
    if host is None:
        context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()
