"""Settings read once from the environment at start-up, and the limits derived from them.

One field per environment variable, named after it, so a validation error names the variable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from llm_sandbox_mcp.defaults import IMAGES, SANDBOX_USER
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.host_memory import physical_memory
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.models import MIN_CPUS, MIN_MEMORY, Limits
from llm_sandbox_mcp.replica_ids import REPLICA
from llm_sandbox_mcp.secret_specs import load_secret_specs

BackendChoice = Literal["auto", "docker", "podman", "kubernetes", "bubblewrap", "nsjail"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
_SECURE = Limits()

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)
# The registry settings: URLs (GOPROXY a list of them, GOSUMDB "name[+key] [url]") that the installer is given.
REGISTRY_SETTINGS = (
    "sandbox_pip_index_url", "sandbox_npm_registry", "sandbox_goproxy", "sandbox_gosumdb", "sandbox_cran_repo",
    "sandbox_gem_source", "sandbox_maven_repo",
)  # fmt: skip
_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s,|]+", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(value: object) -> int:
    """Parse a Docker- or Kubernetes-style size ('512m', '1g', '256Mi', '1048576') into bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512m, 1g or 256Mi")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ValueError("expected a size such as 512m, 1g or 256Mi")
        size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError("must be greater than zero")
    return size


def parse_size_or_zero(value: object) -> int:
    """A size, or 0 (what turns a cache off)."""
    if not isinstance(value, bool) and str(value).strip() == "0":
        return 0
    return parse_size(value)


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def _split_pairs(value: object) -> object:
    if not isinstance(value, str):
        return value
    pairs: dict[str, str] = {}
    for item in (part.strip() for part in value.split(",")):
        key, equals, setting = item.partition("=")
        if item and (not equals or not key.strip()):
            raise ValueError("expected key=value pairs separated by commas, e.g. pool=sandbox,kubernetes.io/arch=amd64")
        if item:
            pairs[key.strip()] = setting.strip()
    return pairs


def _hosts(value: list[str]) -> list[str]:
    for entry in value:
        HostRule.parse(entry, explicit=True)  # raises ValueError naming the bad entry
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_commas)]
HostList = Annotated[list[str], NoDecode, BeforeValidator(_split_commas), AfterValidator(_hosts)]
KeyValues = Annotated[dict[str, str], NoDecode, BeforeValidator(_split_pairs)]
Size = Annotated[int, BeforeValidator(parse_size)]
SizeOrZero = Annotated[int, BeforeValidator(parse_size_or_zero)]


# The OAuth settings that are URLs; the issuer and the resource are needed, and one way to verify a token or both.
_OAUTH_URLS = (
    "sandbox_http_oauth_issuer", "sandbox_http_oauth_resource", "sandbox_http_oauth_introspection_url",
    "sandbox_http_oauth_jwks_url",
)  # fmt: skip
_OAUTH_NEEDED = ("sandbox_http_oauth_issuer", "sandbox_http_oauth_resource")
_OAUTH_VERIFIERS = ("sandbox_http_oauth_introspection_url", "sandbox_http_oauth_jwks_url")


def _check_url(field: str, value: str) -> None:
    """An absolute http(s) URL without a fragment; plain http only to a loopback host (a token crosses it)."""
    name = env_name(field)
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ValueError(f"{name} must be an absolute https:// URL without a fragment (got {value!r})")
    if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        raise ValueError(f"{name} must be https:// (plain http only to localhost, 127.0.0.1 or [::1])")


def _check_oauth(settings: Settings) -> None:
    given = [field for field in _OAUTH_URLS if getattr(settings, field) is not None]
    if not given:
        extra = ("sandbox_http_oauth_scopes", "sandbox_http_oauth_client_id", "sandbox_http_oauth_client_secret_file")
        for field in extra:
            if getattr(settings, field):
                raise ValueError(f"{env_name(field)} is set without {', '.join(env_name(f) for f in _OAUTH_NEEDED)}")
        return
    missing = [env_name(field) for field in _OAUTH_NEEDED if field not in given]
    if missing:
        raise ValueError(f"OAuth needs {' and '.join(missing)} too: the issuer of the tokens and this server's URL")
    if not any(field in given for field in _OAUTH_VERIFIERS):
        raise ValueError(
            "OAuth needs SANDBOX_HTTP_OAUTH_INTROSPECTION_URL (tokens checked by the authorization server), "
            "SANDBOX_HTTP_OAUTH_JWKS_URL (JWT access tokens checked here against its keys), or both"
        )
    for field in given:
        _check_url(field, getattr(settings, field))
    resource = urlsplit(settings.sandbox_http_oauth_resource or "")
    if resource.path != "/mcp" or resource.query:
        raise ValueError(
            "SANDBOX_HTTP_OAUTH_RESOURCE must be the URL clients use for this server's /mcp, e.g. "
            "https://sandbox.example.org/mcp"
        )
    if (settings.sandbox_http_oauth_client_id is None) != (settings.sandbox_http_oauth_client_secret_file is None):
        raise ValueError(
            "SANDBOX_HTTP_OAUTH_CLIENT_ID and SANDBOX_HTTP_OAUTH_CLIENT_SECRET_FILE go together: the credentials "
            "this server presents to the introspection endpoint"
        )
    if settings.sandbox_http_oauth_client_id is not None and settings.sandbox_http_oauth_introspection_url is None:
        raise ValueError(
            "SANDBOX_HTTP_OAUTH_CLIENT_ID is set without SANDBOX_HTTP_OAUTH_INTROSPECTION_URL: the credentials are "
            "for the introspection endpoint only"
        )


_REPLICA_SETTINGS = ("sandbox_http_replica_id", "sandbox_http_peer_url", "sandbox_http_peer_secret_file")
PEER_URL_FIELD = "{replica}"


def _check_replicas(settings: Settings) -> None:
    """The three replica settings together or none; a replica id that fits in an id; a peer URL template that
    names the replica and nothing but a server's address."""
    given = [field for field in _REPLICA_SETTINGS if getattr(settings, field) is not None]
    if not given:
        return
    if len(given) != len(_REPLICA_SETTINGS):
        missing = ", ".join(env_name(field) for field in _REPLICA_SETTINGS if field not in given)
        raise ValueError(
            f"serving as one of several replicas needs {missing} too: this replica's id, the address of a replica "
            "by its id, and the secret the replicas share (see docs/http.md)"
        )
    replica = settings.sandbox_http_replica_id or ""
    if not REPLICA.fullmatch(replica):
        raise ValueError(
            "SANDBOX_HTTP_REPLICA_ID must be 1 to 40 lower-case letters, digits or '-', starting and ending with a "
            f"letter or a digit, such as a StatefulSet pod's name (got {replica!r})"
        )
    template = settings.sandbox_http_peer_url or ""
    parts = urlsplit(template.replace(PEER_URL_FIELD, "replica"))
    if (
        template.count(PEER_URL_FIELD) != 1
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            "SANDBOX_HTTP_PEER_URL must be the address of a replica with {replica} where its id goes, and no path, "
            "e.g. http://{replica}.llm-sandbox-mcp-peers.llm-sandbox-mcp.svc:8000 "
            f"(got {template!r})"
        )


class Settings(BaseSettings):
    """Every environment variable the server reads. Unrelated variables are ignored."""

    model_config = SettingsConfigDict(env_ignore_empty=True, extra="ignore", populate_by_name=True)

    # The reference set (same names and meaning as the best-known alternative).
    backend: BackendChoice = "auto"
    docker_host: str | None = None
    kubeconfig: Path | None = None
    namespace: str = "default"
    commit_container: bool = False
    keep_template: bool = True
    sandbox_network_mode: str = _SECURE.network_mode
    sandbox_read_only: bool = _SECURE.read_only
    sandbox_mem_limit: Size = Field(
        default=_SECURE.memory_bytes, validation_alias=AliasChoices("SANDBOX_MEM_LIMIT", "SANDBOX_MEMORY")
    )
    sandbox_cpus: Annotated[float, Field(ge=MIN_CPUS)] | None = None
    sandbox_cpu_count: PositiveInt | None = None
    sandbox_cap_drop: CommaList = Field(default_factory=lambda: list(_SECURE.cap_drop))
    sandbox_security_opt: CommaList = Field(default_factory=lambda: list(_SECURE.security_opt))
    sandbox_privileged: bool = _SECURE.privileged

    # Ours.
    podman_host: str | None = None
    sandbox_timeout: PositiveFloat = 30.0
    sandbox_max_timeout: PositiveFloat = 300.0
    sandbox_install_timeout: PositiveFloat = 300.0
    sandbox_output_limit: Size = 64 * 1024
    sandbox_pids_limit: PositiveInt = _SECURE.pids
    sandbox_nofile_limit: PositiveInt = _SECURE.nofile
    sandbox_workspace_size: Size = _SECURE.workspace_bytes
    sandbox_tmp_size: Size = _SECURE.tmp_bytes
    sandbox_user: str = SANDBOX_USER
    sandbox_pool_size: int = Field(default=2, ge=0, le=16)
    sandbox_max_concurrency: PositiveInt = 4
    sandbox_zygote: bool = True
    sandbox_zygote_reuse: int = Field(default=100, ge=1, le=100_000)
    sandbox_memory_budget: Size | None = None
    sandbox_cache_max_size: Size = 4 * 1024**3
    sandbox_cache_total_size: Size = 20 * 1024**3
    sandbox_build_cache_size: SizeOrZero = 256 * 1024**2
    sandbox_install_network_mode: str | None = None
    sandbox_install_allow_hosts: HostList = Field(default_factory=lambda: [])
    sandbox_install_ca_bundle: Path | None = None
    sandbox_pip_index_url: str | None = None
    sandbox_npm_registry: str | None = None
    sandbox_goproxy: str | None = None
    sandbox_gosumdb: str | None = None
    sandbox_cran_repo: str | None = None
    sandbox_gem_source: str | None = None
    sandbox_maven_repo: str | None = None
    sandbox_artifact_limit: Size = 4 * 1024**2
    sandbox_log_level: LogLevel = "INFO"
    sandbox_trace_stages: bool = False
    sandbox_bwrap_path: Path | None = None
    sandbox_nsjail_path: Path | None = None
    sandbox_k8s_runtime_class: str | None = None
    sandbox_k8s_node_selector: KeyValues = Field(default_factory=lambda: {})
    sandbox_k8s_pod_template: Path | None = None
    sandbox_k8s_seccomp_profile: str | None = None
    sandbox_k8s_allow_no_network_policy: bool = False
    sandbox_k8s_host_users: bool = True
    sandbox_k8s_start_timeout: PositiveFloat = 120.0
    sandbox_k8s_cache_size: Size = 2 * 1024**3
    sandbox_k8s_cache_storage_class: str | None = None
    sandbox_k8s_cache_access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    sandbox_k8s_sandbox_claims: Literal["auto", "off"] = "auto"
    sandbox_max_sessions: PositiveInt = 8
    sandbox_session_idle_ttl: PositiveFloat = 1800.0
    sandbox_session_max_lifetime: PositiveFloat = 8 * 3600.0
    sandbox_session_max_memory: Size = 2 * 1024**3
    sandbox_session_max_cpus: Annotated[float, Field(ge=MIN_CPUS)] = 2.0
    sandbox_session_network_mode: str | None = None
    sandbox_session_allow_hosts: HostList = Field(default_factory=lambda: [])
    sandbox_session_grant_unasked: bool = False
    sandbox_secrets_file: Path | None = None
    sandbox_foreground_limit: PositiveFloat = 50.0
    sandbox_max_jobs: PositiveInt = 16
    sandbox_job_retention: PositiveFloat = 3600.0
    sandbox_host_dirs: CommaList = Field(default_factory=lambda: [])
    sandbox_max_file_size: Size = 16 * 1024**2
    sandbox_image_python: str = IMAGES["python"]
    sandbox_image_javascript: str = IMAGES["javascript"]
    sandbox_image_go: str = IMAGES["go"]
    sandbox_image_cpp: str = IMAGES["cpp"]
    sandbox_image_java: str = IMAGES["java"]
    sandbox_image_r: str = IMAGES["r"]
    sandbox_image_ruby: str = IMAGES["ruby"]
    sandbox_project_images: bool = True
    sandbox_image_build_network: str | None = None
    sandbox_http_tokens_file: Path | None = None
    sandbox_http_max_calls_per_principal: PositiveInt = 4
    sandbox_http_max_sessions_per_principal: PositiveInt = 4
    sandbox_http_max_jobs_per_principal: PositiveInt = 4
    sandbox_http_max_cache_bytes_per_principal: Size = 4 * 1024**3
    sandbox_http_max_body: Size = 4 * 1024**2
    sandbox_http_request_timeout: PositiveFloat = 30.0
    sandbox_http_max_connections: PositiveInt = 256
    sandbox_http_replica_id: str | None = None
    sandbox_http_peer_url: str | None = None
    sandbox_http_peer_secret_file: Path | None = None
    sandbox_http_oauth_issuer: str | None = None
    sandbox_http_oauth_introspection_url: str | None = None
    sandbox_http_oauth_resource: str | None = None
    sandbox_http_oauth_scopes: CommaList = []
    sandbox_http_oauth_client_id: str | None = None
    sandbox_http_oauth_client_secret_file: Path | None = None
    sandbox_http_oauth_jwks_url: str | None = None
    sandbox_http_oauth_jwks_refetch: PositiveFloat = 60.0
    sandbox_http_oauth_introspection_cache: Annotated[float, Field(ge=0)] = 30.0

    @field_validator(*REGISTRY_SETTINGS)
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        # The installer runs every package's own install code, which would read a credential in its environment or
        # its configuration: refused rather than given to it.
        urls: list[str] = _URL.findall(value or "")
        if any("@" in urlsplit(url).netloc for url in urls):
            raise ValueError(
                "carries credentials (user:password@ in a URL), which the installer and every package's install "
                "code would see; give the registry's URL without them, and reach a registry that needs "
                "credentials through a mirror or proxy of yours that adds them itself"
            )
        return value

    @field_validator("sandbox_secrets_file")
    @classmethod
    def _secrets_file(cls, path: Path | None) -> Path | None:
        if path is not None:
            try:
                load_secret_specs(path)  # refused at start, naming the secret and its problem (never a value)
            except ValueError as exc:
                raise ValueError(str(exc).removeprefix(f"{env_name('sandbox_secrets_file')}: ")) from None
        return path

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if min(self.sandbox_mem_limit, self.sandbox_session_max_memory) < MIN_MEMORY:
            raise ValueError(
                f"SANDBOX_MEM_LIMIT and SANDBOX_SESSION_MAX_MEMORY must be at least {MIN_MEMORY // 1024**2}m"
            )
        if self.sandbox_timeout > self.sandbox_max_timeout:
            raise ValueError("SANDBOX_TIMEOUT must not exceed SANDBOX_MAX_TIMEOUT")
        if not re.fullmatch(r"\d+(:\d+)?", self.sandbox_user):
            raise ValueError("SANDBOX_USER must be a numeric uid or uid:gid, e.g. 65534:65534")
        if self.sandbox_install_ca_bundle is not None and not self.sandbox_install_ca_bundle.is_file():
            raise ValueError("SANDBOX_INSTALL_CA_BUNDLE must name a readable PEM file")
        if self.sandbox_k8s_pod_template is not None and not self.sandbox_k8s_pod_template.is_file():
            raise ValueError("SANDBOX_K8S_POD_TEMPLATE must name a readable YAML or JSON pod manifest")
        profile = self.sandbox_k8s_seccomp_profile
        path = (profile or "").removeprefix("localhost/")
        if profile is not None and (
            not profile.startswith("localhost/")
            or not re.fullmatch(r"[A-Za-z0-9._/-]+", path)
            or any(part in ("", ".", "..") for part in path.split("/"))
        ):
            raise ValueError(
                "SANDBOX_K8S_SECCOMP_PROFILE must be localhost/<path relative to the kubelet's seccomp directory>, "
                "e.g. localhost/llm-sandbox-mcp.json"
            )
        if self.sandbox_user.split(":")[0] == "0":
            raise ValueError("SANDBOX_USER must not be root (uid 0); user code never runs as root")
        _check_oauth(self)
        _check_replicas(self)
        return self

    def memory_budget(self) -> int:
        """SANDBOX_MEMORY_BUDGET, else three quarters of this host's memory."""
        if self.sandbox_memory_budget is not None:
            return self.sandbox_memory_budget
        return physical_memory() * 3 // 4

    def base_image_for(self, language: str) -> str:
        """SANDBOX_IMAGE_* of the language, as configured."""
        image: str = getattr(self, f"sandbox_image_{language}")
        return image

    def limits(self) -> Limits:
        """The per-sandbox limits these settings describe."""
        # SANDBOX_CPU_COUNT is a whole number of CPUs and wins over SANDBOX_CPUS, as in the reference server.
        cpus = (
            float(self.sandbox_cpu_count) if self.sandbox_cpu_count is not None else (self.sandbox_cpus or _SECURE.cpus)
        )
        uid, _, gid = self.sandbox_user.partition(":")
        return Limits(
            memory_bytes=self.sandbox_mem_limit,
            cpus=cpus,
            pids=self.sandbox_pids_limit,
            nofile=self.sandbox_nofile_limit,
            workspace_bytes=self.sandbox_workspace_size,
            tmp_bytes=self.sandbox_tmp_size,
            network_mode=self.sandbox_network_mode,
            read_only=self.sandbox_read_only,
            cap_drop=tuple(self.sandbox_cap_drop),
            security_opt=tuple(self.sandbox_security_opt),
            privileged=self.sandbox_privileged,
            uid=int(uid),
            gid=int(gid or uid),
        )


def env_name(field: str) -> str:
    """The environment variable that sets a Settings field."""
    if field == "sandbox_mem_limit":
        return "SANDBOX_MEM_LIMIT"
    return field.upper()


def load_settings() -> Settings:
    """Read and validate the environment; raise ConfigError with one line per bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        problems: list[str] = []
        for error in exc.errors():
            loc = [str(part) for part in error["loc"]]
            name = env_name(loc[0]) if loc else "configuration"
            if loc and loc[0] not in Settings.model_fields:
                name = loc[0].upper()
            message = str(error["msg"]).removeprefix("Value error, ")
            accepted = _accepted(loc[0]) if loc else ""
            got = error.get("input")
            # A registry setting's value may carry a credential: never repeated.
            shown = f" (got {got!r})" if loc and isinstance(got, str) and loc[0] not in REGISTRY_SETTINGS else ""
            problems.append(f"{name}: {message}{shown}{accepted}")
        raise ConfigError(problems) from None


def _accepted(field: str) -> str:
    annotation = Settings.model_fields[field].annotation if field in Settings.model_fields else None
    choices = get_args(annotation)
    if choices and all(isinstance(c, str) for c in choices):
        return "; accepted: " + ", ".join(choices)
    return ""
