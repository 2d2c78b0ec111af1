"""Secrets bound to hosts (SANDBOX_SECRETS_FILE, create_session(secrets=[...])), attacked from inside real
sandboxes: an HTTPS service on this machine's loopback with a CA of its own stands for the bound API, records
what it receives, and shows where a value went and where only a placeholder did.

Each test is one session of one cell per engine (a few seconds): the attacks share the cell, each its own
request, and each is checked on its own against what the service recorded."""

from __future__ import annotations

import json
import secrets
import tempfile
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager, redirect_stdout
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from urllib.parse import quote

import pytest

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import Session, SessionRegistry
from tests.engines.conftest import engine_settings, require
from tests.support.egress import loopback_name
from tests.support.secret_service import Received, SecretService, secret_service

pytestmark = pytest.mark.anyio

# The three ways a sandbox's stream reaches the server (an exec socket, pipes, the API server's websocket), each
# carrying the relay and the CA certificate written in; Podman and NsJail add nothing to them (both passed when
# this was written, at 2-4 s a test).
ENGINES = [
    pytest.param(engine, marks=getattr(pytest.mark, engine)) for engine in ("docker", "bubblewrap", "kubernetes")
]


@dataclass(frozen=True)
class Secrets:
    service: SecretService
    file: Path
    values: dict[str, str]


@pytest.fixture(scope="module")
def declared() -> Iterator[Secrets]:
    """Three secrets bound to the service's first port: a bearer header, a query parameter, a JSON field."""
    name, address = loopback_name()
    values = {key: f"real-{key.lower()}-{secrets.token_hex(16)}" for key in ("API_TOKEN", "API_KEY", "API_FIELD")}
    with secret_service(name, address) as service, tempfile.TemporaryDirectory(prefix="llm-sandbox-secrets-") as tmp:
        bound = [f"{name}:{service.ports[0]}"]
        document = {
            "API_TOKEN": {"value": values["API_TOKEN"], "hosts": bound},
            "API_KEY": {"value": values["API_KEY"], "hosts": bound, "query": "key"},
            "API_FIELD": {"value": values["API_FIELD"], "hosts": bound, "json_field": "token"},
        }
        path = Path(tmp) / "secrets.json"
        path.write_text(json.dumps(document))
        path.chmod(0o600)
        yield Secrets(service, path, values)


@asynccontextmanager
async def _session(
    request: pytest.FixtureRequest, engine: str, declared: Secrets, language: str = "python"
) -> AsyncGenerator[tuple[SessionRegistry, Session]]:
    await require(request, engine)
    service = declared.service
    first, second = service.ports
    network = [f"{service.name}:{first}", f"{service.name}:{second}", f"localhost:{first}"]
    settings = engine_settings(
        engine,
        sandbox_install_network_mode=None,
        sandbox_session_allow_hosts=network,
        sandbox_secrets_file=declared.file,
        sandbox_install_ca_bundle=service.ca_file,  # the proxy verifies the service against it
    )
    backend = load_backend(settings.backend, settings)
    try:
        async with Executor(settings, backend) as executor:
            sessions = SessionRegistry(settings, executor)
            try:
                session = await sessions.create(language, [], network=network, secrets=sorted(declared.values))
                yield sessions, session
            finally:
                await sessions.aclose()
    finally:
        await backend.aclose()


# Every attack of the cell: each request goes out with every placeholder in every place it can carry one.
ATTACKS = """
import json, os, ssl, urllib.request, urllib.error
context = ssl.create_default_context()  # the proxy's CA through SSL_CERT_FILE, the service's own for end to end
context.load_verify_locations(cadata={service_ca!r})
T, K, F = os.environ["API_TOKEN"], os.environ["API_KEY"], os.environ["API_FIELD"]
def call(url, headers={{}}, body=None):
    headers = {{"Authorization": "Bearer " + T, "X-Other": "Bearer " + T, **headers}}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30, context=context) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
everywhere = json.dumps({{"token": F, "note": F + T + K, "nested": {{"token": F}}}}).encode()
as_json = {{"Content-Type": "application/json"}}
print(json.dumps({{
    "bound": call({bound!r} + "/bound?key=" + K + "&other=" + K + "&t=" + T, as_json, everywhere),
    "other_host": call({other_host!r} + "/other_host?key=" + K, as_json, everywhere),
    "other_port": call({other_port!r} + "/other_port?key=" + K, as_json, everywhere),
    "redirect": call({bound!r} + "/redirect?to=" + {after!r}),
    "echo": call({bound!r} + "/echo"),
    "fronting": call({bound!r} + "/fronting", {{"Host": "localhost:{port}"}}),
    "plain": call({plain!r} + "/plain"),
}}))
print("printed:", T, K, F)
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_secret_reaches_its_bound_host_at_its_bound_place_and_nowhere_else(
    request: pytest.FixtureRequest, engine: str, declared: Secrets
) -> None:
    service = declared.service
    service.received.clear()
    port = service.ports[0]
    code = ATTACKS.format(
        service_ca=service.ca_file.read_text(),
        bound=service.url("", port),
        other_host=service.url("", port, "localhost"),
        other_port=service.url("", service.ports[1]),
        after=quote(service.url("/after", port, "localhost"), safe=""),
        plain=f"http://{service.name}:{port}",
        port=port,
    )
    async with _session(request, engine, declared) as (sessions, session):
        assert session.describe()["secrets"] == ["API_FIELD", "API_KEY", "API_TOKEN"]
        assert session.secrets is not None
        placeholder = {binding.spec.name: binding.placeholder for binding in session.secrets.bindings}
        result = await sessions.execute(session.id, code, [], 120)
    values = declared.values
    token, key, field = (values[name] for name in ("API_TOKEN", "API_KEY", "API_FIELD"))
    ph_token, ph_key, ph_field = (placeholder[name] for name in ("API_TOKEN", "API_KEY", "API_FIELD"))
    assert result.exit_code == 0, result.stderr
    answers = json.loads(result.stdout.splitlines()[0])
    by_path = {record.line.split(" ")[1].split("?")[0]: record for record in service.received}

    # The bound request: each value at its place only; the same placeholders elsewhere in it stay placeholders.
    bound = by_path["/bound"]
    assert answers["bound"] == [200, "ok"], answers
    assert bound.headers["Authorization"] == f"Bearer {token}"
    assert bound.headers["X-Other"] == f"Bearer {ph_token}"
    assert f"key={key}&other={ph_key}&t={ph_token} " in bound.line
    note = ph_field + ph_token + ph_key
    assert json.loads(bound.body) == {"token": field, "note": note, "nested": {"token": ph_field}}

    # Another allowed host, the bound name at another port, the host a redirect led to: placeholders only.
    for path, port_seen in (("/other_host", port), ("/other_port", service.ports[1]), ("/after", port)):
        record = by_path[path]
        assert record.port == port_seen
        assert record.headers["Authorization"] == f"Bearer {ph_token}", path
        assert _carries_none(record, values), path
    assert answers["redirect"] == [200, "ok"], answers
    assert answers["other_host"] == answers["other_port"] == [200, "ok"], answers

    # A bound host that echoes the header got the value; the sandbox gets it masked.
    assert by_path["/echo"].headers["Authorization"] == f"Bearer {token}"
    assert answers["echo"] == [200, "Bearer " + "*" * len(token)], answers
    # A Host header naming another site of the same server is refused, before anything is sent.
    assert answers["fronting"][0] == 403 and "/fronting" not in by_path, answers
    # Plain HTTP to a bound host is refused by the proxy.
    assert answers["plain"][0] == 403 and "only HTTPS" in answers["plain"][1], answers

    # What the code printed reaches the client with the placeholders, and no value anywhere.
    assert f"printed: {ph_token} {ph_key} {ph_field}" in result.stdout
    assert not any(value in result.stdout + result.stderr for value in values.values())


# A JVM client with nothing but the JDK: its proxy and its trust store come from the session's JAVA_TOOL_OPTIONS.
JAVA_CLIENT = """
import java.net.*;
public class Main {{
    public static void main(String[] args) throws Exception {{
        HttpURLConnection bound = (HttpURLConnection) URI.create("{bound}/java").toURL().openConnection();
        bound.setRequestProperty("Authorization", "Bearer " + System.getenv("API_TOKEN"));
        System.out.println(bound.getResponseCode() + " " + new String(bound.getInputStream().readAllBytes()));
    }}
}}
"""


@pytest.mark.parametrize("engine", [pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_jvm_client_trusts_the_proxy_for_a_bound_host_with_nothing_but_the_jdk(
    request: pytest.FixtureRequest, engine: str, declared: Secrets
) -> None:
    """Java reads no PEM bundle: the session gets the JDK's own trust store plus the proxy's CA, and the proxy's
    options beside it in the one variable the JVM reads."""
    service = declared.service
    service.received.clear()
    async with _session(request, engine, declared, "java") as (sessions, session):
        code = JAVA_CLIENT.format(bound=service.url("", service.ports[0]))
        result = await sessions.execute(session.id, code, [], 120)
    assert (result.exit_code, result.stdout) == (0, "200 ok\n"), result.stderr
    (record,) = [record for record in service.received if " /java " in record.line]
    assert record.headers["Authorization"] == f"Bearer {declared.values['API_TOKEN']}"


def _carries_none(record: Received, values: dict[str, str]) -> bool:
    seen = record.line + json.dumps(record.headers) + record.body.decode()
    return not any(value in seen for value in values.values())


# Everything the sandbox's user can read: its environment, every process's environment and command line, and
# every file outside the image's /usr (the proxy CA's key, or any value, would be found there).
SEARCH = """
import os
needles = [{values!r}[name].encode() for name in {names!r}] + [b"PRIVATE KEY"]
hits = []
for name, value in os.environ.items():
    hits += [f"env {{name}}" for needle in needles if needle in value.encode()]
for root, dirs, files in os.walk({root!r}):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("sys", "dev", "usr")]
    if root == "/proc":
        dirs[:] = [d for d in dirs if d.isdigit()]
    if root.startswith("/proc/"):
        dirs[:] = []
        files = [f for f in files if f in ("environ", "cmdline")]
    for file in files:
        path = os.path.join(root, file)
        try:
            if os.path.islink(path) or os.path.getsize(path) > 4 * 1024 * 1024 and not root.startswith("/proc"):
                continue
            with open(path, "rb") as handle:
                data = handle.read(8 * 1024 * 1024)
        except OSError:
            continue
        hits += [f"{{path}}: {{needle[:12]!r}}" for needle in needles if needle in data]
print("hits", sorted(set(hits)))
"""
CA_CERTIFICATES = """
with open(os.environ["NODE_EXTRA_CA_CERTS"]) as ca:
    print("ca", ca.read().count("BEGIN CERTIFICATE"))
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_sandbox_cannot_read_a_value_or_the_proxy_cas_key(
    request: pytest.FixtureRequest, engine: str, declared: Secrets
) -> None:
    """Searched from inside, as code or a package installed in the session would: the values and any private
    key are nowhere it can read; the CA's certificate (public) is there."""
    names = sorted(declared.values)
    async with _session(request, engine, declared) as (sessions, session):
        code = SEARCH.format(values=declared.values, names=names, root="/") + CA_CERTIFICATES
        result = await sessions.execute(session.id, code, [], 120)
    assert result.exit_code == 0, result.stderr
    assert "hits []\n" in result.stdout, result.stdout
    assert "ca 1\n" in result.stdout, result.stdout


def test_the_search_finds_what_it_looks_for() -> None:
    """The search above is not blind: run here over a file holding a value, it reports it."""
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-search-") as tmp:
        Path(tmp, "leak").write_text("x real-api_token-abc y")
        Path(tmp, "key.pem").write_text("-----BEGIN PRIVATE KEY-----")
        code = SEARCH.format(values={"API_TOKEN": "real-api_token-abc"}, names=["API_TOKEN"], root=tmp)
        out = StringIO()
        with redirect_stdout(out):
            exec(code, {})
    assert f"{tmp}/leak: b'real-api_tok'" in out.getvalue()
    assert f"{tmp}/key.pem: b'PRIVATE KEY'" in out.getvalue()
