"""Host-side names for the egress tests, all on this machine: the host's own name (which resolves to a
loopback address through /etc/hosts), and a name in /etc/hosts for a private address nobody serves."""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import docker
import pytest
from docker.errors import DockerException

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.registries import DEFAULT_REGISTRY_COMMANDS, url_rules
from llm_sandbox_mcp.images import run_image

HOSTS = Path("/etc/hosts")
# A private address (nothing on this machine answers there, and no route to it is ever tried: the proxy
# refuses the name before connecting, and the sandbox has no route).
PRIVATE_ADDRESS = "10.255.255.1"
PRIVATE_NAME = "llm-sandbox-egress-private.test"


# The public registries the tiers install from (real packages): Python's, JavaScript's and C++'s (apt).
_REMOTE_REGISTRIES = ("python", "javascript", "cpp")


@functools.cache
def public_registry_hosts() -> tuple[str, ...]:
    """The hosts of the public registries, as an operator lists them in SANDBOX_INSTALL_ALLOW_HOSTS: read off
    the images the tests run, with the commands the server runs in an installer for a toolchain's defaults.

    Here they resolve to a reserved address (this machine's network reaches them through a gateway), which
    the proxy refuses for a toolchain's default; listed, they are reached wherever they resolve, as a
    company mirror on a private address is. A user's machine resolves them to public addresses and needs
    no such setting.
    """
    client = docker.from_env()
    hosts: set[str] = set()
    try:
        for language in _REMOTE_REGISTRIES:
            image = run_image(Settings(), language)
            command = ["sh", "-c", f"{DEFAULT_REGISTRY_COMMANDS[language]}; exit 0"]  # as the server: output only
            printed = client.containers.run(image, command, network_mode="none", remove=True, stdout=True)
            found = [rule.name for rule in url_rules(printed.decode(), explicit=True)]
            if not found:
                pytest.fail(f"{image} names no default {language} registry (printed {printed!r})")
            hosts.update(found)
    except DockerException:
        return ()  # no Docker engine here (a bubblewrap-only run): public installs are refused, as unlisted
    finally:
        client.close()
    return tuple(sorted(hosts))


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
