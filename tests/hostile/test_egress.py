"""Egress: from a sandbox that may reach the network through the proxy (as a library installer or a session
with an allowlist does), only the allowed host is reachable; everything else is refused by the proxy before
it connects anywhere, or has no route at all. Every address involved is on this machine; the private and
metadata addresses are refused before any connection is tried (every connect of this process is recorded).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest

from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.egress.proxy import EgressListener, open_listener
from llm_sandbox_mcp.egress.relay import RELAY_PORT, Relay, proxy_env, relay_alive, start_relay
from llm_sandbox_mcp.egress.tunnel import Tunnels
from llm_sandbox_mcp.file_lock import locked
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.images import run_image
from llm_sandbox_mcp.models import Limits, SandboxRef, SandboxSpec
from tests.engines.conftest import RecordingBackend, engine_settings
from tests.support.connects import recorded
from tests.support.egress import PRIVATE_ADDRESS, loopback_name, private_name

pytestmark = pytest.mark.anyio

# Runs in the sandbox: each case through the proxy (a request head, the status line back) or direct.
PROBE = r"""
import json, socket, sys
port, cases = int(sys.argv[1]), json.loads(sys.argv[2])
def proxied(head):
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head.encode())
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.split(b"\r\n")[0].decode(errors="replace")
def direct(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
def resolve(name):
    try:
        return str(socket.getaddrinfo(name, 80))
    except OSError as e:
        return type(e).__name__
def tls(host, sni):
    import ssl
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    try:
        context.wrap_bio(incoming, outgoing, server_hostname=sni).do_handshake()
    except ssl.SSLWantReadError:
        pass
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(f"CONNECT {host} HTTP/1.1\r\n\r\n".encode())
        status = s.recv(4096).split(b"\r\n")[0].decode(errors="replace")
        s.sendall(outgoing.read())
        return status
def abstract(name):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0" + name)
        return "connected"
    except OSError as e:
        return type(e).__name__
out = {}
for key, (kind, *args) in cases.items():
    out[key] = {"proxied": proxied, "direct": direct, "resolve": resolve, "abstract": abstract, "tls": tls}[kind](*args)
out["interfaces"] = [name for _, name in socket.if_nameindex()]
print(json.dumps(out))
"""


class _Counting(BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Server:
    port: int
    hits: list[str]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    """Two HTTP servers on the host's loopback name: the allowed one and one not on the list."""
    _, address = loopback_name()
    started: list[tuple[ThreadingHTTPServer, Server]] = []
    for _ in range(2):
        hits: list[str] = []
        handler = type("Handler", (_Counting,), {"hits": hits})
        server = ThreadingHTTPServer((address, 0), handler)
        started.append((server, Server(server.server_address[1], hits)))

    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s, _ in started]
    for thread in threads:
        thread.start()
    try:
        yield started[0][1], started[1][1]
    finally:
        for server, _ in started:
            server.shutdown()
            server.server_close()


# Port 443 and the private name in /etc/hosts are the host's own: tests on other engines (pytest-xdist workers)
# take turns with them.
_HOST_WIDE_LOCK = Path(tempfile.gettempdir()) / "llm-sandbox-mcp-tests-port-443.lock"


@pytest.fixture
def tls_server() -> Iterator[list[bytes]]:
    """A server on port 443 of the host's loopback name (as a CDN's address): what each connection sent first."""
    with locked(_HOST_WIDE_LOCK):
        yield from _serve_tls()


def _serve_tls() -> Iterator[list[bytes]]:
    _, address = loopback_name()
    listening = socket.create_server((address, 443))
    listening.settimeout(0.5)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listening.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                connection.settimeout(10)
                try:
                    received.append(connection.recv(65536))
                except OSError:
                    received.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        stop.set()
        thread.join()
        listening.close()


@pytest.fixture
async def egress_sandbox(
    backend: RecordingBackend, engine: str, servers: tuple[Server, Server]
) -> AsyncIterator[tuple[RecordingBackend, EgressListener, SandboxRef, Relay]]:
    name, _ = loopback_name()
    allowed, _ = servers
    rules = [
        HostRule.parse(f"{name}:{allowed.port}", explicit=True),
        HostRule.parse(f"{name}:443", explicit=True),
        HostRule.parse("*.test:443", explicit=False),
    ]
    listener = open_listener(EgressPolicy.of(rules, "SANDBOX_TEST_HOSTS"), "a hostile sandbox")
    settings = engine_settings(engine)
    spec = SandboxSpec(run_image(settings, "python"), replace(Limits(), network_mode="none"), egress=True)
    try:
        ref = await backend.create(spec)
        try:
            async with Tunnels() as tunnels:
                relay = await start_relay(backend, ref, listener, tunnels)
                try:
                    yield backend, listener, ref, relay
                finally:
                    await relay.aclose()
        finally:
            await backend.destroy(ref)
    finally:
        await listener.aclose()


async def test_only_the_allowed_host_is_reachable(
    egress_sandbox: tuple[RecordingBackend, EgressListener, SandboxRef, Relay],
    servers: tuple[Server, Server],
    tls_server: list[bytes],
) -> None:
    backend, listener, ref, _ = egress_sandbox
    tls_server.clear()
    name, _ = loopback_name()
    allowed, unlisted = servers
    allowed.hits.clear()
    unlisted.hits.clear()
    token = secrets.token_hex(8)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0llm-sandbox-egress-{token}")
    abstract.listen(4)
    abstract.setblocking(False)
    cases: dict[str, list[str | int]] = {
        "allowed": ["proxied", f"GET http://{name}:{allowed.port}/allowed HTTP/1.1\r\n\r\n"],
        "allowed_tunnel": ["proxied", f"CONNECT {name}:{allowed.port} HTTP/1.1\r\n\r\n"],
        "unlisted_port": ["proxied", f"GET http://{name}:{unlisted.port}/unlisted HTTP/1.1\r\n\r\n"],
        "unlisted_by_name": ["proxied", f"GET http://localhost:{unlisted.port}/unlisted HTTP/1.1\r\n\r\n"],
        "host_by_ip": ["proxied", f"GET http://127.0.0.1:{allowed.port}/by-ip HTTP/1.1\r\n\r\n"],
        "host_by_name": ["proxied", f"CONNECT localhost:{allowed.port} HTTP/1.1\r\n\r\n"],
        "ip_literal": ["proxied", f"CONNECT {PRIVATE_ADDRESS}:443 HTTP/1.1\r\n\r\n"],
        "metadata": ["proxied", "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n"],
        "metadata_tunnel": ["proxied", "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n"],
        "private_name": ["proxied", "set below"],
        "direct_host_service": ["direct", "127.0.0.1", allowed.port],
        "direct_private": ["direct", PRIVATE_ADDRESS, 80],
        "direct_metadata": ["direct", "169.254.169.254", 80],
        "dns": ["resolve", "llm-sandbox-egress-probe.invalid"],
        "abstract_socket": ["abstract", f"llm-sandbox-egress-{token}"],
        # The same allowed address serving another site (as a CDN does), picked by the TLS server name.
        "tls_named": ["tls", f"{name}:443", name],
        "tls_other_site": ["tls", f"{name}:443", "other-site.example"],
    }
    try:
        with private_name() as private, recorded() as connects:
            cases["private_name"][1] = f"CONNECT {private}:443 HTTP/1.1\r\n\r\n"
            result = await backend.exec(
                ref, ["python3", "-c", PROBE, str(RELAY_PORT), json.dumps(cases)], timeout=120, env=proxy_env()
            )
        with pytest.raises(BlockingIOError):
            abstract.accept()
    finally:
        abstract.close()
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["allowed"] == "HTTP/1.0 200 OK" and seen["allowed_tunnel"].startswith("HTTP/1.1 200")
    for case in ("unlisted_port", "unlisted_by_name", "host_by_ip", "host_by_name", "ip_literal", "metadata",
                 "metadata_tunnel", "private_name"):  # fmt: skip
        assert seen[case] == "HTTP/1.1 403 Forbidden", case
    assert seen["direct_host_service"] == "ConnectionRefusedError"  # the sandbox's own loopback: nothing there
    # No route; on Kubernetes, as on a cluster, the pod keeps its interface and the deny-all policy drops them.
    kubernetes = backend.name == "kubernetes"
    assert seen["direct_private"] == seen["direct_metadata"] == ("TimeoutError" if kubernetes else "OSError")
    assert seen["dns"] == "gaierror"  # no DNS: the proxy resolves
    assert seen["abstract_socket"] == "ConnectionRefusedError"
    assert seen["interfaces"] == (["lo", "eth0"] if kubernetes else ["lo"])
    assert seen["tls_named"] == seen["tls_other_site"] == "HTTP/1.1 200 Connection established"
    for _ in range(200):  # the proxy, on this event loop, may still be forwarding the named one
        if any(tls_server) and any("'other-site.example'" in refusal.reason for refusal in listener.refused):
            break
        await anyio.sleep(0.05)
    hellos = [data for data in tls_server if data]
    assert len(hellos) == 1 and hellos[0][:1] == b"\x16" and name.encode() in hellos[0], tls_server
    assert allowed.hits == ["/allowed"] and unlisted.hits == []
    addresses = [str(a[0]) for a in connects if isinstance(a, tuple)]  # pyright: ignore[reportUnknownArgumentType]
    outside = [address for address in addresses if not ipaddress.ip_address(address).is_loopback]
    assert outside == [], "the proxy tried an address it refused"
    reasons = {refusal.host: refusal.reason for refusal in listener.refused}
    # The sandbox, which may map the internal network through the proxy's resolver, is not told the address.
    assert "non-public address" in reasons[private] and PRIVATE_ADDRESS not in reasons[private]
    assert PRIVATE_ADDRESS.encode() not in result.stdout
    assert {refusal.host: refusal.detail for refusal in listener.refused}[private] == PRIVATE_ADDRESS
    assert set(reasons) >= {name, "localhost", "127.0.0.1", PRIVATE_ADDRESS, "169.254.169.254", private}
    assert any("'other-site.example', not this host" in refusal.reason for refusal in listener.refused)


# Runs in the sandbox: writes frames into the stdout of the tunnel's relay, as any process of the sandbox user can,
# then fetches through the relay as a client does.
FORGE = r"""
import json, os, socket, struct, sys, time
port, forged_request, allowed_request, garbage = int(sys.argv[1]), *sys.argv[2:5]
def frame(kind, stream, payload=b""):
    return struct.pack(">BII", kind, stream, len(payload)) + payload
def cmdline(pid):
    return open(f"/proc/{pid}/cmdline", "rb").read()
# The relay is `perl -e SOURCE -- PORT`; PID 1 of a container is Perl too.
relay = next(p for p in os.listdir("/proc") if p.isdigit() and cmdline(p).endswith(f"\0--\0{port}\0".encode()))
out = open(f"/proc/{relay}/fd/1", "wb", buffering=0)
stream = 4000000000
out.write(frame(1, stream) + frame(2, stream, forged_request.encode()) + frame(3, stream) + frame(2, 12345, b"x"))
def fetch(head, timeout=20):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(head.encode())
            return s.recv(4096).split(b"\r\n")[0].decode()
    except OSError as e:
        return type(e).__name__
first = fetch(allowed_request)
if garbage:
    out.write(b"\xff" * 64)
    for _ in range(100):  # the server ends the tunnel, and the relay its listener
        if fetch(allowed_request, timeout=1) == "ConnectionRefusedError":
            break
        time.sleep(0.1)
print(json.dumps([first, fetch(allowed_request)]))
"""


# Every engine's relay speaks through a tunnel; on bubblewrap and NsJail the sandbox user cannot open the relay's
# /proc/PID/fd/1 (their nested user namespaces refuse it), so forging is tried where it is possible.
@pytest.mark.parametrize("engine", [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("docker", "kubernetes")])
async def test_frames_forged_into_the_tunnel_gain_nothing(
    egress_sandbox: tuple[RecordingBackend, EgressListener, SandboxRef, Relay], servers: tuple[Server, Server]
) -> None:
    """Code in the sandbox shares the relay's user: it can write frames into the relay's output. A forged
    stream is one more connection to the proxy, which refuses what the policy does; a broken frame ends the
    tunnel (that sandbox's egress only), never the server."""
    backend, listener, ref, relay = egress_sandbox
    name, _ = loopback_name()
    allowed, unlisted = servers
    allowed.hits.clear()
    unlisted.hits.clear()
    forged = f"GET http://{name}:{unlisted.port}/forged HTTP/1.1\r\n\r\n"
    fine = f"GET http://{name}:{allowed.port}/allowed HTTP/1.1\r\n\r\n"
    refused_before = listener.refusals
    argv = ["python3", "-c", FORGE, str(RELAY_PORT), forged, fine]
    result = await backend.exec(ref, [*argv, ""], timeout=120)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == ["HTTP/1.0 200 OK", "HTTP/1.0 200 OK"]  # the tunnel still serves
    assert unlisted.hits == [] and allowed.hits == ["/allowed", "/allowed"]
    assert listener.refusals == refused_before + 1  # the forged stream reached the proxy, which refused it
    assert await relay_alive(relay)
    broken = await backend.exec(ref, [*argv, "garbage"], timeout=120)
    assert broken.exit_code == 0, broken.stderr
    assert json.loads(broken.stdout) == ["HTTP/1.0 200 OK", "ConnectionRefusedError"]
    assert not await relay_alive(relay)
    assert unlisted.hits == []
