"""Finding the Podman service, what it is, and raw connections to it.

Discovery order (the first that applies wins):
1. `PODMAN_HOST`, then Podman's own `CONTAINER_HOST`: named by the user, so used as given or reported as
   unreachable, never skipped for another socket.
2. `DOCKER_HOST`, only when it answers as Podman: it usually names Docker's socket, for `BACKEND=docker`,
   but Podman users often point it at Podman's Docker-compatible socket, which is the same socket.
3. The connections Podman keeps (`_endpoints.podman_connections`), a Podman machine's API socket on this host
   in place of its ssh:// address.
4. The default sockets (not on Windows): rootful `/run/podman/podman.sock` and rootless
   `$XDG_RUNTIME_DIR/podman/podman.sock` (`/run/user/$UID/...` when the variable is unset), the one that
   belongs to the server's own user first. A default that does not answer is passed over for the next.
"""

# The podman SDK is unannotated.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from podman import PodmanClient
from podman.errors.exceptions import APIError

from llm_sandbox_mcp.backends._endpoints import Candidate as Candidate
from llm_sandbox_mcp.backends._endpoints import connect as connect
from llm_sandbox_mcp.backends._endpoints import podman_connections
from llm_sandbox_mcp.backends._endpoints import unix_path as unix_path
from llm_sandbox_mcp.errors import BackendUnavailable

ROOTFUL_SOCKET = "/run/podman/podman.sock"
API_TIMEOUT = 120
_LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
START_HINT = (
    "Start the Podman service (Linux rootless: `systemctl --user enable --now podman.socket`; rootful: "
    "`systemctl enable --now podman.socket`, or `podman system service --time=0 unix:///run/podman/podman.sock`; "
    "macOS: `podman machine init` once, then `podman machine start`), or set PODMAN_HOST to its socket, e.g. "
    "unix:///run/user/1000/podman/podman.sock; `llm-sandbox-mcp doctor` checks it."
)
LIMITS_HINT = (
    "use rootful Podman (PODMAN_HOST=unix:///run/podman/podman.sock) or a host with cgroup v2 and the memory, "
    "pids and cpu controllers delegated to the user"
)


def candidates(
    podman_host: str | None,
    docker_host: str | None,
    environ: Mapping[str, str],
    uid: int | None,
    home: Path | None = None,
    platform: str = "linux",
) -> list[Candidate]:
    """Sockets to try, in order. `uid` is None off Linux, where Podman runs in a machine and the rootful and
    rootless sockets are not on this host; `home` None skips Podman's own configuration of connections."""
    if podman_host:
        return [Candidate(podman_host, "PODMAN_HOST", explicit=True)]
    if environ.get("CONTAINER_HOST"):
        return [Candidate(environ["CONTAINER_HOST"], "CONTAINER_HOST", explicit=True)]
    found = [Candidate(docker_host, "DOCKER_HOST")] if docker_host else []
    if home is not None:
        found += podman_connections(home, environ, platform)
    if uid is not None:
        runtime_dir = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
        rootful = Candidate(f"unix://{ROOTFUL_SOCKET}", "the rootful default socket")
        rootless = Candidate(f"unix://{runtime_dir}/podman/podman.sock", "the rootless default socket")
        found += [rootful, rootless] if uid == 0 else [rootless, rootful]
    unique: dict[str, Candidate] = {}
    for candidate in found:
        unique.setdefault(unix_path(candidate.url) or candidate.url, candidate)
    return list(unique.values())


def find(sockets: Sequence[Candidate]) -> tuple[PodmanClient, Candidate]:
    """A client of the first candidate that answers as Podman. Raises BackendUnavailable saying what was tried."""
    tried: list[str] = []
    for candidate in sockets:
        where = f"{candidate.url} ({candidate.source})"
        try:
            check_scheme(candidate.url)
        except ValueError as exc:
            if candidate.explicit:
                raise BackendUnavailable(f"{candidate.source}: {exc}") from exc
            tried.append(f"{where}: {exc}")
            continue
        try:
            connect(candidate.url, timeout=10).close()  # first, as the SDK leaks the socket of a failed connection
        except OSError as exc:
            problem = exc.strerror or str(exc)
        else:
            client = PodmanClient(base_url=candidate.url, timeout=API_TIMEOUT)
            problem = _not_podman(client)
            if problem is None:
                return client, candidate
            client.close()
        if candidate.explicit:
            raise BackendUnavailable(f"The Podman service at {where} does not answer ({problem}). {START_HINT}")
        tried.append(f"{where}: {problem}")
    raise BackendUnavailable(f"No Podman service found (tried {'; '.join(tried)}). {START_HINT}")


def _not_podman(client: PodmanClient) -> str | None:
    """Why the service behind `client` is not Podman, or None when it is (libpod ping, which Docker lacks)."""
    try:
        response = client.api.get("/_ping")
    except APIError as exc:
        return detail(exc)
    if response.status_code == 200 and response.headers.get("Libpod-Api-Version"):
        return None
    return f"answers, but is not the Podman API (HTTP {response.status_code})"


def detail(exc: APIError) -> str:
    """The service's own message, or for a failed connection the innermost OS error (what the user can act on)."""
    if exc.response is not None:
        return str(exc.explanation or exc)
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    return str(exc)


@dataclass(frozen=True)
class Engine:
    """What the service says about itself (`GET /info`)."""

    version: str
    api_version: str
    rootless: bool
    cgroup: str
    controllers: tuple[str, ...]
    runtime: str

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Engine:
        host = info.get("host") or {}
        version = info.get("version") or {}
        return cls(
            version=str(version.get("Version", "?")),
            api_version=str(version.get("APIVersion", "?")),
            rootless=bool((host.get("security") or {}).get("rootless")),
            cgroup=str(host.get("cgroupVersion", "?")),
            controllers=tuple(host.get("cgroupControllers") or ()),
            runtime=str((host.get("ociRuntime") or {}).get("name", "?")),
        )

    def limits_problem(self) -> str | None:
        """Why this engine would run sandboxes without their memory, CPU and pids limits, if it would."""
        missing = [name for name in _LIMIT_CONTROLLERS if name not in self.controllers]
        if not self.rootless or (self.cgroup == "v2" and not missing):
            return None
        why = "cgroup v1" if self.cgroup != "v2" else f"the {', '.join(missing)} cgroup controllers not delegated"
        return f"Rootless Podman with {why} cannot enforce memory, CPU and pids limits; {LIMITS_HINT}"


def check_scheme(url: str) -> None:
    """Raise ValueError, with the way out, for an address the raw exec connection cannot reach."""
    scheme = urlparse(url).scheme
    if scheme in ("ssh", "http+ssh"):
        raise ValueError(
            "ssh:// addresses are not supported; forward the socket instead "
            "(`ssh -L /tmp/podman.sock:/run/podman/podman.sock HOST`) and use unix:///tmp/podman.sock"
        )
    if scheme not in ("unix", "http+unix", "tcp", "http"):
        raise ValueError(f"unsupported address {url!r}; use unix:///path/to/podman.sock or tcp://host:port")
