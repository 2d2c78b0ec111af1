"""The TLS server name of a tunnel's first flight, from ClientHellos made by Python's own TLS stack, and from
malformed ones."""

from __future__ import annotations

import asyncio

import pytest

from llm_sandbox_mcp.egress.tls import MAX_HELLO, NotAClientHello, read_client_hello, server_name, starts_tls
from tests.support.tls import client_hello

pytestmark = pytest.mark.anyio


async def _read(data: bytes) -> tuple[bytes, bytes]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await read_client_hello(reader)


async def test_the_name_a_real_client_asks_for_is_read_and_its_bytes_kept() -> None:
    first = client_hello("Files.PythonHosted.org")
    records, hello = await _read(first + b"application data after it")
    assert records == first and starts_tls(first)
    assert server_name(hello) == "files.pythonhosted.org"
    _, bare = await _read(client_hello(None))
    assert server_name(bare) is None


async def test_a_hello_split_over_records_is_put_together() -> None:
    first = client_hello("registry.npmjs.org")
    message = first[5:]
    split = b"".join(bytes([22, 3, 1]) + len(part).to_bytes(2, "big") + part for part in (message[:7], message[7:]))
    records, hello = await _read(split)
    assert records == split and hello == message and server_name(hello) == "registry.npmjs.org"


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",  # not TLS
        bytes([23, 3, 3, 0, 5]) + b"hello",  # application data first
        bytes([22, 3, 3, 0, 0]),  # an empty record
        bytes([22, 3, 3, 0xFF, 0xFF]) + b"x" * 0xFFFF,  # past the largest record
        bytes([22, 3, 3, 0, 4, 2, 0, 0, 0]),  # a ServerHello, not a ClientHello
        bytes([22, 3, 3, 0, 4, 1, 0xFF, 0xFF, 0xFF]),  # a ClientHello claiming 16 MiB
    ],
)
async def test_what_is_not_a_client_hello_is_refused(data: bytes) -> None:
    with pytest.raises(NotAClientHello):
        await _read(data)


async def test_a_flood_of_small_records_stops_at_the_bound() -> None:
    header = bytes([1, 0, 0xEA, 0x60])  # a ClientHello of 60000 bytes, sent a byte per record
    flood = bytes([22, 3, 1, 0, 4]) + header + (bytes([22, 3, 1, 0, 1]) + b"x") * (MAX_HELLO // 6 + 10)
    with pytest.raises(NotAClientHello, match="longer than"):
        await _read(flood)


async def test_a_stream_that_ends_early_is_not_a_hello() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await _read(client_hello("pypi.org")[:40])


def _with_names(names: list[tuple[int, bytes]], twice: bool = False) -> bytes:
    """A minimal ClientHello carrying a server_name extension with `names` (kind, value)."""
    entries = b"".join(bytes([kind]) + len(value).to_bytes(2, "big") + value for kind, value in names)
    extension = (0).to_bytes(2, "big") + (len(entries) + 2).to_bytes(2, "big") + len(entries).to_bytes(2, "big")
    extension += entries
    extensions = extension * (2 if twice else 1)
    body = b"\x03\x03" + b"r" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += len(extensions).to_bytes(2, "big") + extensions
    return bytes([1]) + len(body).to_bytes(3, "big") + body


def test_malformed_server_names_are_refused() -> None:
    assert server_name(_with_names([(0, b"pypi.org.")])) == "pypi.org"
    for hello in (
        _with_names([(0, b"pypi.org\xff")]),  # not ASCII
        _with_names([(0, b"a.example"), (0, b"b.example")]),  # two names
        _with_names([(0, b"pypi.org")], twice=True),  # the extension twice
        _with_names([(0, b"")]),
        _with_names([(0, b"pypi.org")])[:-3],  # cut short
    ):
        with pytest.raises(NotAClientHello):
            server_name(hello)
