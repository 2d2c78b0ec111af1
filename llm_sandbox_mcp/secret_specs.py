"""Secrets an operator declares in SANDBOX_SECRETS_FILE: where each value comes from, the hosts it may go to,
and the one place in a request it goes (a header, a query parameter or a JSON body field).

The file is read at start-up (its shape and its permissions: refused when group or others may read or write
it); a value from a variable, a file or a command is read only when a session asks for the secret. No message
here ever carries a value, nor a command's output: errors name the secret and the problem.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from llm_sandbox_mcp.host_rules import HostRule

SETTING = "SANDBOX_SECRETS_FILE"
SecretSource = Literal["value", "value_env", "value_file", "value_command"]
PlaceKind = Literal["header", "query", "json_field"]
_SOURCES: tuple[SecretSource, ...] = ("value", "value_env", "value_file", "value_command")
# A command that prints a value (a secret manager's client): its time, and how much of its output is read.
COMMAND_SECONDS = 15.0
_COMMAND_OUTPUT = 64 * 1024
_PLACES: tuple[PlaceKind, ...] = ("header", "query", "json_field")
_KEYS = frozenset({*_SOURCES, *_PLACES, "hosts", "format"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_QUERY_NAME = re.compile(r"[A-Za-z0-9._~-]+")
# Secrets go only to HTTPS: a host without a port is its port 443.
_TLS_PORT = 443
# Headers the proxy owns or that frame the request: a secret never goes there.
_FRAMING = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "upgrade", "expect"}
)
# Variables the server sets in a sandbox: a secret's placeholder must not replace one.
RESERVED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LANG",
        "TMPDIR",
        "OUTPUT_DIR",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "JAVA_TOOL_OPTIONS",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "NODE_PATH",
    }
)


class SecretUnavailable(Exception):
    """A declared secret whose value cannot be read now (its variable unset, its file missing); the message
    names the secret and the cause, never a value."""


@dataclass(frozen=True)
class SecretPlace:
    """Where the value goes: the header `name` (its value written as `format`, `{}` standing for the secret),
    the query parameter `name`, or the top-level field `name` of a JSON body."""

    kind: PlaceKind
    name: str
    format: str = "{}"

    def render(self, secret: str) -> str:
        return self.format.replace("{}", secret, 1)

    def display(self) -> str:
        if self.kind == "header":
            return f"header {self.name}: {self.format}"
        return f"{'query parameter' if self.kind == 'query' else 'JSON field'} {self.name}"


@dataclass(frozen=True)
class SecretSpec:
    """One declared secret. `source` says where the value comes from; `origin` is the inline value (never
    shown), the variable's name, the file's path, or the command's arguments (`value_command`)."""

    name: str
    source: SecretSource
    origin: str | tuple[str, ...] = field(repr=False)
    hosts: tuple[HostRule, ...]
    place: SecretPlace

    def read_value(self, environ: Mapping[str, str] | None = None) -> str:
        """The value now. Raises SecretUnavailable."""
        environ = os.environ if environ is None else environ
        origin = self.origin
        if isinstance(origin, tuple):
            value = self._run(origin, environ)
        elif self.source == "value":
            value = origin
        elif self.source == "value_env":
            if not environ.get(origin):
                raise SecretUnavailable(f"secret {self.name}: the variable {origin} is not set for the server")
            value = environ[origin]
        else:
            try:
                value = Path(origin).read_text(encoding="utf-8").strip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
                raise SecretUnavailable(f"secret {self.name}: its file {origin} cannot be read ({reason})") from None
        problem = value_problem(value)
        if problem is not None:
            raise SecretUnavailable(f"secret {self.name}: its value {problem}")
        return value

    def _run(self, argv: tuple[str, ...], environ: Mapping[str, str]) -> str:
        """The first line a command prints, run with the server's environment and no shell or input. Its output
        and its error text are never repeated: they may hold the value."""
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=COMMAND_SECONDS, env=dict(environ),
                check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SecretUnavailable(
                f"secret {self.name}: its command {argv[0]} did not finish in {COMMAND_SECONDS:g} s"
            ) from None
        except OSError as exc:
            raise SecretUnavailable(
                f"secret {self.name}: its command {argv[0]} cannot be run ({exc.strerror or type(exc).__name__})"
            ) from None
        if done.returncode != 0:
            raise SecretUnavailable(f"secret {self.name}: its command {argv[0]} exited with status {done.returncode}")
        try:
            text = done.stdout[:_COMMAND_OUTPUT].decode("utf-8")
        except UnicodeDecodeError:
            raise SecretUnavailable(f"secret {self.name}: its command {argv[0]} printed no UTF-8 text") from None
        lines = text.strip("\r\n").splitlines()
        if len(lines) != 1:
            printed = "nothing" if not lines else f"{len(lines)} lines"
            raise SecretUnavailable(f"secret {self.name}: its command {argv[0]} printed {printed}, not one line")
        return lines[0]

    def bound_to(self, host: str, port: int) -> bool:
        return any(rule.covers(host) and port in rule.ports for rule in self.hosts)


def value_problem(value: str) -> str | None:
    """Why a value cannot go into a request (it would break a header or a URL), or None."""
    if not value:
        return "is empty"
    if any(ord(char) < 0x20 or ord(char) > 0x7E for char in value):
        return "holds a character that is not printable ASCII (a line break?)"
    return None


def load_secret_specs(path: Path) -> dict[str, SecretSpec]:
    """Read and check SANDBOX_SECRETS_FILE. Raises ValueError naming the secret and the problem (never a value)."""
    try:
        info = path.stat()
    except OSError as exc:
        raise ValueError(f"{SETTING}: {path} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{SETTING}: {path} is not a file")
    if os.name == "posix" and info.st_mode & 0o077:
        raise ValueError(
            f"{SETTING}: {path} may be read or written by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"make it the server user's alone: chmod 600 {path}"
        )
    try:
        document: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{SETTING}: {path} cannot be read ({type(exc).__name__})") from None
    except json.JSONDecodeError as exc:  # its message names a position, never the text
        raise ValueError(f"{SETTING}: {path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{SETTING}: {path} must hold a JSON object mapping each secret's name to its declaration")
    entries = cast("dict[str, object]", document)
    return {name: _spec(name, entry) for name, entry in entries.items()}


def _spec(name: str, entry: object) -> SecretSpec:
    def problem(text: str) -> ValueError:
        return ValueError(f"{SETTING}: secret {name!r}: {text}")

    if not _NAME.fullmatch(name):
        raise problem("a name must be an environment variable's name (letters, digits, _; 64 at most)")
    if name.upper() in RESERVED_NAMES or name.upper().startswith(("LLM_SANDBOX", "NPM_CONFIG_", "LD_")):
        raise problem("that name is a variable the server sets in sandboxes; choose another")
    if not isinstance(entry, dict):
        raise problem("its declaration must be a JSON object")
    fields = cast("dict[str, object]", entry)
    unknown = sorted(set(fields) - _KEYS)
    if unknown:
        raise problem(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    sources: list[SecretSource] = [source for source in _SOURCES if source in fields]
    if len(sources) != 1:
        raise problem('give exactly one of "value", "value_env", "value_file", "value_command"')
    source = sources[0]
    origin = fields[source]
    if source == "value_command":
        return SecretSpec(
            name, source, _argv(origin, problem), _hosts(fields.get("hosts"), problem), _place(fields, problem)
        )
    if not isinstance(origin, str) or not origin:
        raise problem(f'"{source}" must be a non-empty string')
    if source == "value":
        trouble = value_problem(origin)
        if trouble is not None:
            raise problem(f"its value {trouble}")
    return SecretSpec(name, source, origin, _hosts(fields.get("hosts"), problem), _place(fields, problem))


def _argv(origin: object, fail: Callable[[str], ValueError]) -> tuple[str, ...]:
    """A command as its arguments (run with no shell, so nothing in them is interpreted)."""
    if not isinstance(origin, list) or not origin:
        raise fail('"value_command" must be a non-empty list of arguments, e.g. ["op", "read", "op://vault/item"]')
    argv = cast("list[object]", origin)
    if not all(isinstance(part, str) and part and "\x00" not in part for part in argv):
        raise fail('"value_command": each argument must be a non-empty string')
    return tuple(cast("list[str]", argv))


def _hosts(hosts: object, fail: Callable[[str], ValueError]) -> tuple[HostRule, ...]:
    if not isinstance(hosts, list) or not hosts:
        raise fail('"hosts" must be a non-empty list of "host" or "host:port" (HTTPS; no port: 443)')
    rules: list[HostRule] = []
    for entry in cast("list[object]", hosts):
        if not isinstance(entry, str) or entry.strip().startswith("*"):
            raise fail(f'"hosts": {entry!r} is not a host name or host:port (no wildcards: a secret names its hosts)')
        try:
            rule = HostRule.parse(entry, explicit=False)
        except ValueError as exc:
            raise fail(f'"hosts": {exc}') from None
        if ":" not in entry.strip().removeprefix("[").rsplit("]", 1)[-1]:
            rule = HostRule(rule.name, frozenset({_TLS_PORT}))
        rules.append(rule)
    return tuple(dict.fromkeys(rules))


def _place(fields: dict[str, object], fail: Callable[[str], ValueError]) -> SecretPlace:
    places: list[PlaceKind] = [place for place in _PLACES if place in fields]
    if len(places) > 1:
        raise fail('give at most one of "header", "query", "json_field"')
    kind: PlaceKind = places[0] if places else "header"
    where = fields.get(kind, "Authorization")
    if not isinstance(where, str) or not where:
        raise fail(f'"{kind}" must be a non-empty string')
    form = fields.get("format")
    if form is not None and kind != "header":
        raise fail('"format" applies to a header only')
    if kind == "header":
        if not _TOKEN.fullmatch(where) or where.lower() in _FRAMING or where.lower().startswith("proxy-"):
            raise fail(f'"header": {where!r} is not a header a secret may go in')
        form = "Bearer {}" if form is None and where.lower() == "authorization" else form or "{}"
        if not isinstance(form, str) or form.count("{}") != 1 or value_problem(form.replace("{}", "x")):
            raise fail('"format" must be printable ASCII with exactly one {} where the value goes')
        return SecretPlace("header", where, form)
    if kind == "query" and not _QUERY_NAME.fullmatch(where):
        raise fail(f'"query": {where!r} must be letters, digits or ._~-')
    return SecretPlace(kind, where)
