"""Which hosts a sandbox may reach: exact names and `*.suffix` wildcards, with ports, and which addresses.

A rule the operator wrote down (a registry URL, SANDBOX_INSTALL_ALLOW_HOSTS, SANDBOX_SESSION_ALLOW_HOSTS
matched exactly) is *explicit*: that host is reached wherever it resolves, a company mirror on a private
address included. Every other match (wildcards, a toolchain's default registry) reaches public addresses
only, and IP literals are never matched but by an explicit rule naming that very address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from llm_sandbox_mcp.host_rules import HostRule, IPAddress, ip_literal

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix: the IPv4 address in the last 32 bits
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: a network's own translators
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d
_SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")  # deprecated, still routed inside some networks


def _carried_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form leads to: mapped, NAT64, 6to4, Teredo's client, IPv4-compatible."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def public(address: IPAddress) -> bool:
    """Whether an address is on the public internet: not loopback, private, link-local, shared, unspecified,
    reserved or multicast. An IPv6 form that carries an IPv4 address (mapped, NAT64, 6to4, Teredo,
    IPv4-compatible) is judged as that address too; local NAT64 and site-local addresses are never public."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64_LOCAL or address in _SITE_LOCAL:
            return False
        carried = _carried_ipv4(address)
        if carried is not None and not public(carried):
            return False
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Refusal:
    """Why a connection was refused, and the setting that would allow it."""

    host: str
    port: int
    reason: str
    # For the operator's log only (the addresses a name resolved to): the sandbox, which may be probing the
    # internal network through the proxy's resolver, and the model are never told.
    detail: str = ""
    # Whether adding the host to the setting would allow it (not so for a secret's rules).
    settable: bool = True

    def message(self, setting: str) -> str:
        fix = f"; {setting} can allow it" if self.settable else ""
        return f"{self.host}:{self.port} was refused ({self.reason}){fix}"

    def logged(self, setting: str) -> str:
        return self.message(setting) + (f" [{self.detail}]" if self.detail else "")


@dataclass(frozen=True)
class EgressPolicy:
    """A sandbox's allowlist. `setting` names where an operator adds hosts (for messages)."""

    rules: tuple[HostRule, ...]
    setting: str

    @classmethod
    def of(cls, rules: Iterable[HostRule], setting: str) -> EgressPolicy:
        return cls(tuple(dict.fromkeys(rules)), setting)

    def match(self, host: str, port: int) -> HostRule | Refusal:
        """The rule that allows `host:port` (host normalized), else the refusal. Addresses are checked later."""
        matching = [rule for rule in self.rules if rule.covers(host)]
        allowed = [rule for rule in matching if port in rule.ports]
        if not allowed:
            if matching:
                return Refusal(host, port, f"port {port} is not allowed for this host")
            kind = "an IP address" if ip_literal(host) is not None else "a host"
            return Refusal(host, port, f"{kind} not on this sandbox's allowlist")
        return max(allowed, key=lambda rule: rule.explicit)

    def addresses(self, rule: HostRule, host: str, port: int, found: Iterable[IPAddress]) -> list[IPAddress] | Refusal:
        """The resolved addresses `rule` lets the proxy connect to, else why none."""
        found = list(dict.fromkeys(found))
        if not found:
            return Refusal(host, port, "the name does not resolve")
        if ip_literal(host) is not None and not rule.explicit:
            return Refusal(host, port, "an IP address that is not listed explicitly")
        allowed = found if rule.explicit else [address for address in found if public(address)]
        if not allowed:
            shown = ", ".join(map(str, found[:3]))
            return Refusal(host, port, "resolves to a non-public address and is not listed explicitly", shown)
        return allowed

    def summary(self) -> list[str]:
        return [rule.display() for rule in self.rules]
