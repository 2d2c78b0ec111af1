"""The server's end of the egress tunnel against a relay that lies: its output is written by a fake relay here
(the protocol is pure code; the real relay in a real pod is in tests/engines/test_egress.py and
tests/hostile/test_egress.py), and the proxy's end is a real socket pair per stream, handed over in-process as
the proxy does, whose far end echoes and counts connections."""

from __future__ import annotations

import socket
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest
from anyio.abc import SocketStream

from llm_sandbox_mcp.backends._kubernetes.pod import NETWORK_LABEL, PodOptions, pod_manifest
from llm_sandbox_mcp.egress import tunnel as tunnel_module
from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.egress.proxy import open_listener
from llm_sandbox_mcp.egress.tunnel import (
    CLOSE,
    DATA,
    EOF,
    HEADER,
    MAX_PAYLOAD,
    MAX_STREAMS,
    OPEN,
    PING,
    RELAY_WINDOW_BYTES,
    WINDOW,
    WINDOW_BYTES,
    Tunnel,
    Tunnels,
)
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import Limits, SandboxSpec

pytestmark = pytest.mark.anyio


def frame(kind: int, stream_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, stream_id, len(payload)) + payload


def frames(data: bytes) -> list[tuple[int, int, bytes]]:
    found: list[tuple[int, int, bytes]] = []
    while data:
        kind, stream_id, length = HEADER.unpack_from(data)
        found.append((kind, stream_id, data[HEADER.size : HEADER.size + length]))
        data = data[HEADER.size + length :]
    return found


class FakeRelay:
    """A SandboxProcess whose output is whatever the test writes, and whose input is recorded."""

    def __init__(self) -> None:
        self._writer, self._reader = anyio.create_memory_object_stream[bytes](100)
        self.received = bytearray()
        self.gone = False
        self.closed = False
        self.answers = True
        # How long a send takes (the real ones write from a worker thread); one cancelled meanwhile has written
        # part of a frame, so the real process is shut with it, and so is this one (`torn`).
        self.send_seconds = 0.0
        self.torn = False

    async def write(self, data: bytes) -> None:
        await self._writer.send(data)

    def end(self) -> None:
        self._writer.close()

    async def send(self, data: bytes) -> None:
        if self.gone:
            raise SandboxFailure("The sandbox process is gone")
        if self.send_seconds:
            try:
                await anyio.sleep(self.send_seconds)
            except anyio.get_cancelled_exc_class():
                self.torn = self.gone = True
                raise
        if data == frame(PING, 0) and self.answers:
            self._writer.send_nowait(data)
        self.received += data

    async def receive(self, timeout: float) -> bytes | None:
        with anyio.move_on_after(timeout):
            try:
                return await self._reader.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return b""
        return None

    def stderr_tail(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        self.closed = True
        self._writer.close()
        self._reader.close()

    def sent(self) -> list[tuple[int, int, bytes]]:
        """What the tunnel sent, window grants aside."""
        return [found for found in frames(bytes(self.received)) if found[0] != WINDOW]

    def granted(self, stream_id: int) -> int:
        return sum(
            int.from_bytes(p, "big") for k, i, p in frames(bytes(self.received)) if (k, i) == (WINDOW, stream_id)
        )

    def data_to(self, stream_id: int) -> int:
        return sum(len(p) for k, i, p in self.sent() if (k, i) == (DATA, stream_id))


BIG = bytes(range(256)) * 16384  # 4 MiB: more than any window


@dataclass
class Proxy:
    """The proxy's end: echoes each connection until its EOF, then closes it; "big" is answered with BIG."""

    connections: int = 0
    open: int = 0
    hold: anyio.Event = field(default_factory=anyio.Event)

    async def serve(self, connection: SocketStream) -> None:
        self.connections += 1
        self.open += 1
        try:
            async with connection:
                while True:
                    try:
                        data = await connection.receive()
                        if data == b"hold":
                            await self.hold.wait()
                        await connection.send(BIG if data == b"big" else data)
                    except (anyio.EndOfStream, anyio.BrokenResourceError):  # the tunnel closed the stream
                        break
        finally:
            self.open -= 1


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.01)


@asynccontextmanager
async def tunnel() -> AsyncGenerator[tuple[FakeRelay, Tunnel, Proxy]]:
    proxy = Proxy()
    async with anyio.create_task_group() as tasks:

        async def connect() -> SocketStream:
            ours, theirs = socket.socketpair()
            try:
                served = await SocketStream.from_socket(ours)
            except BaseException:
                ours.close()
                theirs.close()
                raise
            tasks.start_soon(proxy.serve, served)
            try:
                return await SocketStream.from_socket(theirs)
            except BaseException:
                theirs.close()
                raise

        async with Tunnels() as tunnels:
            relay = FakeRelay()
            opened = await tunnels.open(relay, connect, "a test sandbox", b"")
            yield relay, opened, proxy
            await opened.aclose()
        tasks.cancel_scope.cancel()


async def test_a_stream_carries_both_ways_and_closes_after_both_ends() -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(frame(OPEN, 7) + frame(DATA, 7, b"GET / HTTP/1.1\r\n\r\n"))
        await until(lambda: (DATA, 7, b"GET / HTTP/1.1\r\n\r\n") in relay.sent())
        await relay.write(frame(EOF, 7))
        await until(lambda: (CLOSE, 7, b"") in relay.sent())
        assert relay.sent() == [(DATA, 7, b"GET / HTTP/1.1\r\n\r\n"), (EOF, 7, b""), (CLOSE, 7, b"")]
        assert proxy.connections == 1 and opened.streams == 0


async def test_frames_may_arrive_split_anywhere_and_several_at_once() -> None:
    async with tunnel() as (relay, _, _):
        data = frame(OPEN, 1) + frame(DATA, 1, b"abc") + frame(OPEN, 2) + frame(DATA, 2, b"xyz") + frame(EOF, 1)
        for offset in range(0, len(data), 4):
            await relay.write(data[offset : offset + 4])
        await until(lambda: (CLOSE, 1, b"") in relay.sent() and (DATA, 2, b"xyz") in relay.sent())
        assert (DATA, 1, b"abc") in relay.sent()


async def test_an_oversized_frame_ends_the_tunnel_without_waiting_for_its_payload() -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(frame(OPEN, 1))
        await until(lambda: proxy.open == 1)
        await relay.write(HEADER.pack(DATA, 1, MAX_PAYLOAD + 1))
        await until(opened.ended.is_set)
        await until(lambda: proxy.open == 0)  # its streams went with it
        assert relay.closed  # and the relay's stream: the relay ends and frees its port


async def test_a_header_that_claims_four_gigabytes_allocates_nothing() -> None:
    async with tunnel() as (relay, opened, _):
        await relay.write(HEADER.pack(DATA, 1, 2**32 - 1) + b"x" * 100)
        await until(opened.ended.is_set)


@pytest.mark.parametrize("garbage", [b"\xff" * 64, b"\x00" * 64, b"HTTP/1.1 200 OK\r\n\r\n"])
async def test_garbage_ends_the_tunnel(garbage: bytes) -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(garbage)
        await until(opened.ended.is_set)
        assert proxy.connections == 0


async def test_frames_for_ids_that_are_not_open_are_ignored() -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(frame(DATA, 99, b"to nobody") + frame(EOF, 98) + frame(CLOSE, 97))
        await relay.write(frame(OPEN, 1) + frame(DATA, 1, b"still here") + frame(EOF, 1))
        await until(lambda: (CLOSE, 1, b"") in relay.sent())
        assert (DATA, 1, b"still here") in relay.sent()
        assert [stream_id for _, stream_id, _ in relay.sent()] == [1, 1, 1]
        assert proxy.connections == 1 and not opened.ended.is_set()


async def test_data_after_eof_and_a_reopened_id_are_harmless() -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(frame(OPEN, 1) + frame(DATA, 1, b"hold"))
        await until(lambda: proxy.open == 1)
        await relay.write(frame(OPEN, 1) + frame(EOF, 1) + frame(DATA, 1, b"after eof"))
        proxy.hold.set()
        await until(lambda: (CLOSE, 1, b"") in relay.sent())
        assert b"after eof" not in relay.received
        assert proxy.connections == 1 and not opened.ended.is_set()


async def test_streams_beyond_the_cap_are_ignored() -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(b"".join(frame(OPEN, stream_id) for stream_id in range(1, MAX_STREAMS + 3)))
        await relay.write(frame(DATA, MAX_STREAMS + 1, b"ignored") + frame(DATA, 1, b"served"))
        await until(lambda: (DATA, 1, b"served") in relay.sent() and proxy.connections == MAX_STREAMS)
        assert opened.streams == MAX_STREAMS
        assert relay.sent() == [(DATA, 1, b"served")]
        # A closed stream makes room again.
        await relay.write(frame(CLOSE, 1) + frame(OPEN, 1000))
        await until(lambda: proxy.connections == MAX_STREAMS + 1)


async def test_the_relay_is_sent_no_more_than_its_window() -> None:
    async with tunnel() as (relay, opened, proxy):
        await relay.write(frame(OPEN, 1) + frame(DATA, 1, b"big"))
        await until(lambda: relay.data_to(1) == RELAY_WINDOW_BYTES)
        await sync(relay, 2)  # another stream is served meanwhile, and nothing more came for this one
        assert relay.data_to(1) == RELAY_WINDOW_BYTES
        await relay.write(frame(WINDOW, 1, (100_000).to_bytes(4, "big")))
        await until(lambda: relay.data_to(1) == RELAY_WINDOW_BYTES + 100_000)
        # A grant beyond the window (forged) counts only up to the window.
        await relay.write(frame(WINDOW, 1, (2**32 - 1).to_bytes(4, "big")) + frame(WINDOW, 1, b"bad"))
        await until(lambda: relay.data_to(1) == 2 * RELAY_WINDOW_BYTES + 100_000)
        await sync(relay, 3)
        assert relay.data_to(1) == 2 * RELAY_WINDOW_BYTES + 100_000
        assert proxy.connections == 3 and not opened.ended.is_set()


async def test_data_beyond_the_window_it_was_given_closes_that_stream() -> None:
    async with tunnel() as (relay, opened, proxy):
        chunk = b"x" * MAX_PAYLOAD
        # In one write, so all of it is taken in before the proxy is given any.
        await relay.write(
            frame(OPEN, 1) + b"".join(frame(DATA, 1, chunk) for _ in range(WINDOW_BYTES // MAX_PAYLOAD + 1))
        )
        await until(lambda: (CLOSE, 1, b"") in relay.sent())
        await until(lambda: proxy.open == 0)
        await sync(relay, 2)
        assert relay.data_to(1) == 0 and not opened.ended.is_set()


async def test_what_the_proxy_takes_is_granted_back() -> None:
    async with tunnel() as (relay, _, _):
        await relay.write(frame(OPEN, 1) + frame(DATA, 1, b"a" * 1000) + frame(DATA, 1, b"b" * 500))
        await until(lambda: relay.granted(1) == 1500)


async def test_a_stream_the_relay_closes_mid_send_never_cuts_the_frame_nor_the_other_streams() -> None:
    """A client in the sandbox that drops a download (a response it does not read, closed with a reset) makes
    the relay send CLOSE while a frame of that stream is on its way: the frame is written whole, and the next
    connection goes through (a cut frame lost the relay, and a request just accepted with it)."""
    async with tunnel() as (relay, opened, proxy):
        relay.send_seconds = 0.05
        await relay.write(frame(OPEN, 1) + frame(DATA, 1, b"big"))
        await until(lambda: relay.data_to(1) > 0)
        await relay.write(frame(CLOSE, 1))
        await until(lambda: proxy.open == 0)
        await sync(relay, 2)
        assert not relay.torn and not opened.ended.is_set()


async def sync(relay: FakeRelay, stream_id: int) -> None:
    """A round trip through a stream of its own: what the tunnel had to do before, it has done."""
    await relay.write(frame(OPEN, stream_id) + frame(DATA, stream_id, b"ping") + frame(EOF, stream_id))
    await until(lambda: (CLOSE, stream_id, b"") in relay.sent())


async def test_a_truncated_header_at_the_relay_s_end_ends_the_tunnel_quietly(caplog: pytest.LogCaptureFixture) -> None:
    async with tunnel() as (relay, opened, _):
        await relay.write(frame(OPEN, 1)[:5])
        relay.end()
        await until(opened.ended.is_set)
    assert "failed" not in caplog.text


async def test_a_relay_that_is_gone_ends_only_its_streams(caplog: pytest.LogCaptureFixture) -> None:
    async with tunnel() as (relay, opened, proxy):
        relay.gone = True
        await relay.write(frame(OPEN, 1) + frame(DATA, 1, b"echoed to nobody"))
        await until(lambda: proxy.connections == 1 and proxy.open == 0 and opened.streams == 0)
        assert not opened.ended.is_set()
    assert "failed" not in caplog.text


async def test_a_relay_is_alive_while_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tunnel_module, "PING_SECONDS", 0.2)
    async with tunnel() as (relay, opened, _):
        assert await opened.alive()
        relay.answers = False
        assert not await opened.alive()
        relay.answers = True
        relay.end()
        await until(opened.ended.is_set)
        assert not await opened.alive()


async def test_tunnels_refuse_to_open_outside_their_context() -> None:
    relay = FakeRelay()
    with pytest.raises(SandboxFailure, match="not running"):
        await Tunnels().open(relay, open_listener(EgressPolicy.of([], "-"), "-").connect, "a test sandbox")
    await relay.aclose()


def test_a_pod_that_may_reach_the_proxy_mounts_no_host_path() -> None:
    spec = SandboxSpec("image", Limits(), egress=True)
    manifest = pod_manifest("pod", spec, {}, {}, PodOptions())
    assert all("hostPath" not in volume for volume in manifest["spec"]["volumes"])
    assert manifest["metadata"]["labels"][NETWORK_LABEL] == "none"  # under the deny-all NetworkPolicy
