"""An HTTPS service on this machine's loopback with a CA of its own, standing for an API a secret is bound to:
it records every request it receives (line, headers, body) and answers a few paths the attacks need.

    /echo            answers with the Authorization header it got (a host that reflects the credential)
    /redirect?to=U   answers 302 to U (a bound host sending the client elsewhere)
    anything else    answers 200 "ok"

The same service listens on two ports; its certificate names the host's name and `localhost`, so one process
stands for the bound host, the bound name at another port, and another allowed host.
"""

from __future__ import annotations

import datetime
import ssl
import tempfile
import threading
from collections.abc import Generator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Received:
    port: int
    line: str
    headers: dict[str, str]
    body: bytes


@dataclass
class SecretService:
    name: str
    ports: tuple[int, int]
    ca_file: Path
    received: list[Received] = field(default_factory=lambda: [])

    def url(self, path: str, port: int | None = None, host: str | None = None) -> str:
        return f"https://{host or self.name}:{port or self.ports[0]}{path}"


def _certificates(directory: Path, names: list[str]) -> tuple[Path, Path]:
    """A CA (its certificate written to ca.pem) and a leaf for `names` signed by it (leaf.pem, key and chain)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secret service test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign and crl_sign: OpenSSL 3 refuses a CA without them
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in names]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, leaf_file = directory / "ca.pem", directory / "leaf.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    leaf_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + leaf.public_bytes(serialization.Encoding.PEM)
    )
    return ca_file, leaf_file


@contextmanager
def secret_service(name: str, address: str) -> Generator[SecretService]:
    """The service on two ports of `address` (a loopback address `name` resolves to on the host)."""
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-secret-service-") as tmp, ExitStack() as stack:
        ca_file, leaf_file = _certificates(Path(tmp), [name, "localhost"])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(leaf_file)
        service = SecretService(name, (0, 0), ca_file)
        ports: list[int] = []
        for _ in range(2):
            server = ThreadingHTTPServer((address, 0), _handler(service))
            server.socket = context.wrap_socket(server.socket, server_side=True)
            thread = threading.Thread(target=server.serve_forever, name="secret-service", daemon=True)
            thread.start()
            stack.callback(thread.join, 5)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
            ports.append(server.server_address[1])
        service.ports = (ports[0], ports[1])
        yield service


def _handler(service: SecretService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            port: int = self.connection.getsockname()[1]
            service.received.append(Received(port, self.requestline, dict(self.headers.items()), body))
            url = urlsplit(self.path)
            if url.path == "/echo":
                answer, status, extra = (self.headers.get("Authorization") or "").encode(), 200, {}
            elif url.path == "/redirect":
                answer, status, extra = b"", 302, {"Location": parse_qs(url.query)["to"][0]}
            else:
                answer, status, extra = b"ok", 200, {}
            self.send_response(status)
            for key, value in extra.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _serve

    return Handler
