"""Hosts as an operator writes them down: `host`, `host:port`, `*.suffix`, `[v6]:port`, parsed and normalized.

The vocabulary of every allowlist: the settings validate SANDBOX_*_ALLOW_HOSTS with it at start-up, and the
egress proxy (`egress.policy`) matches each connection against the rules it makes.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# Ports a rule without one allows: HTTP and HTTPS.
WEB_PORTS = frozenset({80, 443})
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"\d{1,5}")
_NUMERIC = re.compile(r"0x[0-9a-f]*|[0-9]+")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def normalize_host(host: str) -> str | None:
    """The host in canonical form (lowercase, no trailing dot, IPv6 without brackets), or None if malformed."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ip_literal(host) is not None:
        return str(ip_literal(host))
    host = host.removesuffix(".")
    labels = host.split(".")
    if not host or len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    # A name ending in a number is an IPv4 address in another spelling (127.1, 0x7f.1, 2130706433) to the
    # resolver: refused, as no allowlist names hosts that way.
    if _NUMERIC.fullmatch(labels[-1]):
        return None
    return host


def ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostRule:
    """One allowed host: `name` exact, or every name below `name` when `wildcard` (written `*.name`)."""

    name: str
    ports: frozenset[int] = WEB_PORTS
    wildcard: bool = False
    explicit: bool = False

    @classmethod
    def parse(cls, text: str, *, explicit: bool) -> HostRule:
        """`host`, `host:port`, `*.suffix`, `[v6]:port`. A wildcard is never explicit: it names no host."""
        entry = text.strip().lower()
        wildcard = entry.startswith("*.")
        entry = entry.removeprefix("*.")
        ports = WEB_PORTS
        head, colon, tail = entry.rpartition(":")
        if colon and _PORT.fullmatch(tail) and (not head.count(":") or head.startswith("[")):
            entry, ports = head, frozenset({int(tail)})
        name = normalize_host(entry)
        if name is None or (wildcard and ip_literal(name) is not None) or any(not 0 < p < 65536 for p in ports):
            raise ValueError(f"not a host name, host:port or *.domain: {text!r}")
        return cls(name, ports, wildcard, explicit and not wildcard)

    def covers(self, host: str) -> bool:
        return host.endswith("." + self.name) if self.wildcard else host == self.name

    def display(self) -> str:
        name = ("*." if self.wildcard else "") + (f"[{self.name}]" if ":" in self.name else self.name)
        return name if self.ports == WEB_PORTS else f"{name}:{','.join(map(str, sorted(self.ports)))}"
