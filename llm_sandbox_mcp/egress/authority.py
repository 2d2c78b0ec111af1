"""The certificate authority of this server process, for the hosts a secret is bound to, and only those.

Made when the server starts with secrets declared: its private key lives in this process's memory and is never
written anywhere; its certificate (public) is what a sandbox given secrets trusts. A leaf certificate per bound
host is made on demand, with a key of its own; the stdlib `ssl` loads a key only from a file, so the leaf's key
passes through a 0600 file in a 0700 directory of the server's (never mounted into any sandbox) and is removed
at once. The real host is verified against the system's store plus SANDBOX_INSTALL_CA_BUNDLE.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llm_sandbox_mcp.host_rules import ip_literal

_CA_DAYS = 365
_LEAF_DAYS = 30
_ALPN = ["http/1.1"]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class Authority:
    """The per-process CA, the server contexts of its leaves (one per host), and the context that verifies
    the real hosts."""

    def __init__(self, extra_ca: Path | None = None) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = _name(f"llm-sandbox-mcp secrets proxy {os.getpid()}")
        self._subject = subject
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.certificate_pem = self._certificate.public_bytes(serialization.Encoding.PEM)
        self._extra_ca = extra_ca
        self._servers: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self.upstream = self._upstream_context()

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS server context that presents a leaf for `host`, made on first use."""
        with self._lock:
            context = self._servers.get(host)
            if context is None:
                context = self._servers[host] = self._leaf(host)
            return context

    def _leaf(self, host: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        literal = ip_literal(host)
        alternative: x509.GeneralName = (
            x509.IPAddress(ipaddress.ip_address(literal)) if literal is not None else x509.DNSName(host)
        )
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([alternative]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        chain = certificate.public_bytes(serialization.Encoding.PEM)
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(_ALPN)
        with tempfile.TemporaryDirectory(prefix="llm-sandbox-leaf-") as directory:  # 0700
            path = Path(directory) / "leaf.pem"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(private + chain)
            context.load_cert_chain(path)
        return context

    def _upstream_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(_ALPN)
        if self._extra_ca is not None:
            context.load_verify_locations(cafile=str(self._extra_ca))
        return context
