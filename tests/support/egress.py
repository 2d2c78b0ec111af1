"""Host-side names for the egress tests, all on this machine: the host's own name (which resolves to a
loopback address through /etc/hosts), and a name in /etc/hosts for a private address nobody serves."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import pytest

HOSTS = Path("/etc/hosts")
# A private address (nothing on this machine answers there, and no route to it is ever tried: the proxy
# refuses the name before connecting, and the sandbox has no route).
PRIVATE_ADDRESS = "10.255.255.1"
PRIVATE_NAME = "llm-sandbox-egress-private.test"


def loopback_name() -> tuple[str, str]:
    """The host's name and the loopback address it resolves to on the host (from /etc/hosts)."""
    name = socket.gethostname()
    try:
        address = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        pytest.fail(f"the host name {name!r} must resolve (it does through /etc/hosts on Debian): {exc}")
    if not ipaddress.ip_address(address).is_loopback:
        pytest.fail(f"the host name {name!r} resolves to {address}, not to a loopback address")
    return name, str(address)


@contextmanager
def private_name() -> Generator[str]:
    """PRIVATE_NAME in /etc/hosts (added and removed again; the file is edited in place, as it may be a mount)."""
    line = f"{PRIVATE_ADDRESS}\t{PRIVATE_NAME}\n"
    original = HOSTS.read_text()
    if PRIVATE_NAME not in original:
        with HOSTS.open("a") as hosts:
            hosts.write(("" if original.endswith("\n") else "\n") + line)
    try:
        yield PRIVATE_NAME
    finally:
        kept = [entry for entry in HOSTS.read_text().splitlines(keepends=True) if PRIVATE_NAME not in entry]
        HOSTS.write_text("".join(kept))
