"""Secrets a session asks for by name (`create_session(secrets=[...])`): checked against the operator's file
and the session's network, given a placeholder each, and the CA the sandbox must trust to reach their hosts.

What the sandbox gets: the variable NAME holding the placeholder (random per session, unrelated to the value),
and the proxy CA's certificate in /tmp/llm-sandbox-ca with the variables that make clients trust it. The value
stays in this process: the session's proxy puts it in requests to the bound hosts (`egress.bound`), and what
a session returns to the client is scanned for it (`redact_execution`).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.authority import Authority
from llm_sandbox_mcp.egress.bound import SecretRoutes
from llm_sandbox_mcp.egress.policy import EgressPolicy, Refusal
from llm_sandbox_mcp.egress.substitution import Binding, redact
from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.models import Execution
from llm_sandbox_mcp.secret_specs import SETTING, SecretSpec, SecretUnavailable, load_secret_specs

CA_DIR = "/tmp/llm-sandbox-ca"
CA_FILE = f"{CA_DIR}/proxy-ca.pem"
BUNDLE_FILE = f"{CA_DIR}/bundle.pem"
JAVA_TRUST_STORE = f"{CA_DIR}/java-cacerts.p12"
# The JDK's own store's password, as every JDK ships it (it guards nothing: a trust store holds no secret).
_JAVA_STORE_PASSWORD = "changeit"
# The system's store where the image keeps it (Debian, Fedora, Alpine), then the proxy's CA after it.
_SYSTEM_BUNDLES = "/etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem"
# Where there is a JDK, its own trust store plus the proxy's CA, for JVM clients (Java reads no PEM bundle).
# Without one, an empty file stands in: no JVM there to read it.
_JAVA_STORE = (
    f"if command -v keytool >/dev/null 2>&1; then "
    f'jdk=$(dirname "$(dirname "$(readlink -f "$(command -v keytool)")")") && '
    f'cp "$jdk/lib/security/cacerts" {JAVA_TRUST_STORE} && chmod 644 {JAVA_TRUST_STORE} && '
    f"keytool -importcert -noprompt -alias llm-sandbox-egress-proxy -file {CA_FILE} -keystore {JAVA_TRUST_STORE} "
    f"-storepass {_JAVA_STORE_PASSWORD} >/dev/null; "
    f"else : > {JAVA_TRUST_STORE}; fi"
)
TRUST_SCRIPT = (
    f"umask 022 && mkdir -p {CA_DIR} && cat > {CA_FILE} && : > {BUNDLE_FILE} && "
    f'for f in {_SYSTEM_BUNDLES}; do if [ -r "$f" ]; then cat "$f" > {BUNDLE_FILE}; break; fi; done && '
    f"cat {CA_FILE} >> {BUNDLE_FILE} && {_JAVA_STORE}"
)


def trust_env() -> dict[str, str]:
    """Variables that make OpenSSL, Python's requests, curl, Node and the JVM trust the proxy's CA too (the JVM's
    options are added to the proxy's, see `run.environment`)."""
    java = (
        f"-Djavax.net.ssl.trustStore={JAVA_TRUST_STORE} -Djavax.net.ssl.trustStoreType=PKCS12 "
        f"-Djavax.net.ssl.trustStorePassword={_JAVA_STORE_PASSWORD}"
    )
    return {
        "SSL_CERT_FILE": BUNDLE_FILE,
        "REQUESTS_CA_BUNDLE": BUNDLE_FILE,
        "CURL_CA_BUNDLE": BUNDLE_FILE,
        "NODE_EXTRA_CA_CERTS": CA_FILE,
        "JAVA_TOOL_OPTIONS": java,
    }


class SessionSecrets:
    """This server's declared secrets and its CA (made at start when secrets are declared)."""

    def __init__(self, settings: Settings) -> None:
        self._file: Path | None = settings.sandbox_secrets_file
        self.authority = Authority(settings.sandbox_install_ca_bundle) if self._file is not None else None

    def bind(self, names: list[str], policy: EgressPolicy | None) -> SecretRoutes:
        """The bindings of `names` for a new session whose network is `policy`. Raises InvalidRequest naming
        the secret and the fix; reads each value now (a value from a variable or a file may be gone)."""
        if self._file is None or self.authority is None:
            raise InvalidRequest(f"This server declares no secrets (the operator lists them in {SETTING})")
        try:
            declared = load_secret_specs(self._file)
        except ValueError as exc:
            raise InvalidRequest(f"The server's secrets cannot be read now: {exc}") from None
        if len(set(names)) != len(names):
            raise InvalidRequest("secrets: a name is given twice")
        bindings: list[Binding] = []
        for name in names:
            spec = declared.get(name)
            if spec is None:
                known = ", ".join(sorted(declared)) or "none"
                raise InvalidRequest(f"secrets: {name!r} is not a secret this server declares (declared: {known})")
            _within(spec, policy)
            try:
                value = spec.read_value()
            except SecretUnavailable as exc:
                raise InvalidRequest(f"secrets: {exc}; the operator must provide it") from None
            placeholder = f"sbx-secret-{name.lower().replace('_', '-')}-{secrets.token_hex(20)}"
            bindings.append(Binding(spec, placeholder, value))
        return SecretRoutes(tuple(bindings), self.authority)


def _within(spec: SecretSpec, policy: EgressPolicy | None) -> None:
    """Each of the secret's hosts must be in the session's own network (never added behind its back)."""
    for rule in spec.hosts:
        for port in sorted(rule.ports):
            if policy is None or isinstance(policy.match(rule.name, port), Refusal):
                shown = rule.name if port == 443 else f"{rule.name}:{port}"
                raise InvalidRequest(
                    f"secrets: {spec.name} goes to {shown}, which this session's network does not include; "
                    f"add {shown!r} to network"
                )


def placeholders_env(routes: SecretRoutes) -> dict[str, str]:
    return {binding.spec.name: binding.placeholder for binding in routes.bindings} | trust_env()


def redact_execution(execution: Execution, routes: SecretRoutes) -> Execution:
    """The execution with every secret's value taken out of its output, messages and inline files."""
    bindings = routes.bindings
    execution.stdout = redact(execution.stdout, bindings)
    execution.stderr = redact(execution.stderr, bindings)
    if execution.message is not None:
        execution.message = redact(execution.message, bindings)
    execution.artifacts = [_redacted_file(artifact, routes) for artifact in execution.artifacts]
    return execution


def _redacted_file(artifact: Artifact, routes: SecretRoutes) -> Artifact:
    data = artifact.data
    if data is None or not any(value.encode() in data for value in routes.values()):
        return artifact
    data = redact_bytes(data, routes)
    return artifact.model_copy(update={"data": data, "size": len(data)})


def redact_bytes(data: bytes, routes: SecretRoutes) -> bytes:
    """A file's bytes with every secret's value replaced by a marker naming its secret."""
    for binding in sorted(routes.bindings, key=lambda b: len(b.value), reverse=True):
        data = data.replace(binding.value.encode(), f"[secret {binding.spec.name} redacted]".encode())
    return data


def redact_text(text: str, routes: SecretRoutes | None) -> str:
    return text if routes is None else redact(text, routes.bindings)
