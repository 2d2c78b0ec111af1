"""The installer's allowlist: the registries of its language, as configured or as the image's toolchain has
them by default, plus SANDBOX_INSTALL_ALLOW_HOSTS.

Hosts the operator configured (a registry setting, SANDBOX_INSTALL_ALLOW_HOSTS) are explicit: reached
wherever they resolve. A toolchain's defaults are read from the image (no registry is named here) and reach
public addresses only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from llm_sandbox_mcp.host_rules import HostRule

INSTALL_SETTING = "SANDBOX_INSTALL_ALLOW_HOSTS"
_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s\"',;|]+", re.IGNORECASE)
_DEFAULT_PORTS = {"http": 80, "https": 443}

# What a language's toolchain in the image uses when its registry setting is unset: commands that print
# those URLs (in any surrounding text). Languages whose setting is required (Java) have none; C++ always
# uses the image's apt sources.
DEFAULT_REGISTRY_COMMANDS: dict[str, str] = {
    "python": "python3 -c 'from pip._internal.models.index import PyPI; print(PyPI.url); "
    'print("https://" + PyPI.file_storage_domain)\'; python3 -m pip config list 2>/dev/null',
    "javascript": "npm config get registry",
    "go": "go env GOPROXY; go env GOSUMDB | sed 's/^\\([^+ ]*\\).*/https:\\/\\/\\1/'",
    "cpp": "cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null",
    "r": 'Rscript -e \'cat(getOption("repos"), sep = "\\n")\'',
    "ruby": "gem sources",
}


def url_rules(text: str, *, explicit: bool) -> list[HostRule]:
    """A rule for the host (and port) of each URL in `text`."""
    rules: list[HostRule] = []
    for match in _URL.finditer(text):
        try:
            url = urlsplit(match.group(0))
            port = url.port or _DEFAULT_PORTS.get(url.scheme.lower())
        except ValueError:
            continue
        if url.hostname and port:
            host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
            try:
                rules.append(HostRule.parse(f"{host}:{port}", explicit=explicit))
            except ValueError:
                continue
    return rules


def gosumdb_rules(value: str) -> list[HostRule]:
    """GOSUMDB is `off`, `name[+key]` (served at https://name) or `name[+key] url`."""
    words = value.split()
    if not words or words[0] == "off":
        return []
    url = words[1] if len(words) > 1 else f"https://{words[0].split('+', 1)[0]}"
    return url_rules(url, explicit=True)


def configured_rules(registry: dict[str, str], extra: Iterable[str]) -> list[HostRule]:
    """The operator's: the hosts of the registry settings in force (`variable: value`), and `extra` hosts."""
    rules: list[HostRule] = []
    for variable, value in registry.items():
        rules += gosumdb_rules(value) if variable == "GOSUMDB" else url_rules(value, explicit=True)
    return rules + [HostRule.parse(host, explicit=True) for host in extra]
