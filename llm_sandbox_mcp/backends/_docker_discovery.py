"""Finding the Docker engine the user has, as the docker CLI would, and saying where it was found.

Order (the first that answers wins):
1. DOCKER_HOST: named by the user, so used as given or reported as unreachable, never skipped.
2. The current Docker context (DOCKER_CONTEXT, else `currentContext` in ~/.docker/config.json), read with the
   SDK's `ContextAPI`: what Docker Desktop, Colima and OrbStack set up, TLS included.
3. The well-known sockets and pipes (`_endpoints.docker_sockets`).
"""

# types-docker leaves the context API unannotated.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import docker
import docker.errors
from docker.context import Context, ContextAPI
from docker.context.config import get_current_context_name
from docker.tls import TLSConfig
from docker.utils.config import find_config_file

from llm_sandbox_mcp.backends._endpoints import (
    ENGINE_CONNECTIONS,
    Candidate,
    absent,
    docker_sockets,
    refuses,
    shown,
    unix_path,
)
from llm_sandbox_mcp.errors import BackendUnavailable

API_TIMEOUT = 120
_PROBE_TIMEOUT = 10
START_HINT = (
    "Start Docker (Docker Desktop, Colima: `colima start`, OrbStack, Rancher Desktop; Linux: `systemctl start "
    "docker`), or set DOCKER_HOST to its socket, e.g. unix:///var/run/docker.sock (Windows: "
    "npipe:////./pipe/docker_engine); `llm-sandbox-mcp doctor` checks it."
)


def docker_candidates(
    docker_host: str | None, environ: Mapping[str, str], home: Path, platform: str
) -> tuple[list[Candidate], list[str]]:
    """Addresses to try, in order, and what could not be read on the way (a broken context)."""
    if docker_host:
        return [Candidate(docker_host, "DOCKER_HOST", explicit=True)], []
    found: list[Candidate] = []
    problems: list[str] = []
    try:
        context = current_context(environ, home)
    except docker.errors.DockerException as exc:
        problems.append(str(exc))
    else:
        if context is not None:
            found.append(context)
    for candidate in docker_sockets(home, environ, platform):
        if all(candidate.url != known.url for known in found):
            found.append(candidate)
    return found, problems


def current_context(environ: Mapping[str, str], home: Path) -> Candidate | None:
    """The current Docker context's endpoint, or None for the built-in `default` context (the default socket,
    which the well-known list holds). Raises DockerException for a context that cannot be read."""
    name = environ.get("DOCKER_CONTEXT")
    if name:
        why = "DOCKER_CONTEXT"
    else:
        name = get_current_context_name()
        config = find_config_file()
        why = f"currentContext in {shown(Path(str(config)), home)}" if config else "currentContext"
    if name == "default":
        return None
    try:
        context = cast("Context | None", ContextAPI.get_context(name))  # None when there is none, unlike its stub
    except docker.errors.DockerException:
        raise
    except Exception as exc:  # the SDK raises a bare Exception for a damaged meta.json
        raise docker.errors.ContextException(f"Docker context {name!r} ({why}) cannot be read: {exc}") from exc
    if context is None:
        raise docker.errors.ContextException(
            f"Docker context {name!r} ({why}) does not exist (`docker context ls` lists them)"
        )
    host = str(context.Host or "")
    if not host:
        return None
    return Candidate(host, f"Docker context {name!r} ({why})", tls=context.TLSConfig or None)


def find_docker(candidates: Sequence[Candidate], problems: Sequence[str] = ()) -> tuple[docker.DockerClient, Candidate]:
    """A client of the first candidate that answers. Raises BackendUnavailable saying what was tried and the fix."""
    tried = list(problems)
    missing: list[str] = []
    for candidate in candidates:
        where = f"{candidate.url} ({candidate.source})"
        if absent(candidate.url):
            # Checked up front: the SDK leaks its socket when the connection to a missing path fails.
            if candidate.explicit:
                raise BackendUnavailable(
                    f"The Docker engine socket {unix_path(candidate.url)} does not exist (from {candidate.source}). "
                    + START_HINT
                )
            missing.append(candidate.source)
            continue
        refused = refuses(candidate.url)
        if refused is not None:
            if candidate.explicit:
                raise BackendUnavailable(f"The Docker engine at {where} does not answer ({refused}). {START_HINT}")
            tried.append(f"{where}: {refused}")
            continue
        client: docker.DockerClient | None = None
        try:
            client = docker.DockerClient(
                base_url=candidate.url,
                tls=cast("TLSConfig | bool", candidate.tls or False),
                timeout=_PROBE_TIMEOUT,
                max_pool_size=ENGINE_CONNECTIONS,
            )
            client.ping()
        except Exception as exc:
            # The SDK's named-pipe transport raises pywin32's own error for a missing pipe, not a DockerException.
            if not isinstance(exc, docker.errors.DockerException) and not candidate.url.startswith("npipe:"):
                raise
            if client is not None:
                client.close()
            if candidate.explicit:
                raise BackendUnavailable(f"The Docker engine at {where} does not answer ({exc}). {START_HINT}") from exc
            tried.append(f"{where}: {exc}")
            continue
        client.api.timeout = API_TIMEOUT
        return client, candidate
    if missing:
        tried.append("no socket at " + ", ".join(missing))
    raise BackendUnavailable(f"No Docker engine found (tried {'; '.join(tried) or 'nothing'}). {START_HINT}")


def discovered(docker_host: str | None, platform: str) -> tuple[docker.DockerClient, Candidate]:
    """The engine for this server's environment (see the module's order)."""
    candidates, problems = docker_candidates(docker_host, os.environ, Path.home(), platform)
    return find_docker(candidates, problems)
