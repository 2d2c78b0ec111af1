"""The Kubernetes "engine" of the engine tier: one API server test double (tests/support/k8s_double) per test session,
and a second one with the agent-sandbox CRDs installed (`agent_sandbox=True`) for the tests of sandbox claims.

Each is started on first use, so runs that select no Kubernetes test start nothing; `stop()` (a session fixture in
conftest.py) removes every container and volume it made. Its node behaves like a kubelet a platform team
configured for sandboxes: `--pod-max-pids` at the sandbox pids limit (Kubernetes has no per-pod pids field), and
llm-sandbox-mcp's seccomp profile in its seccomp directory as `SECCOMP_PROFILE` (the recipe in docs/engines.md).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import docker
import docker.errors

from llm_sandbox_mcp.errors import BackendUnavailable
from llm_sandbox_mcp.models import Limits
from llm_sandbox_mcp.seccomp.oci import PROFILE_JSON
from tests.support.k8s_double import KubeApiDouble

RUNTIME_CLASSES = ("gvisor",)
SECCOMP_PROFILE = "localhost/llm-sandbox-mcp.json"

_lock = threading.Lock()
# Whether the agent-sandbox CRDs are installed -> that double, and the directory of its kubeconfig and seccomp root.
_doubles: dict[bool, tuple[KubeApiDouble, Path]] = {}


def double(agent_sandbox: bool = False) -> KubeApiDouble:
    """The session's double, started on first call. Raises BackendUnavailable when Docker is missing."""
    with _lock:
        if agent_sandbox not in _doubles:
            directory = Path(tempfile.mkdtemp(prefix="llm-sandbox-kube-"))
            seccomp_root = directory / "seccomp"
            seccomp_root.mkdir()
            (seccomp_root / SECCOMP_PROFILE.removeprefix("localhost/")).write_text(PROFILE_JSON)
            try:
                started = KubeApiDouble(
                    runtime_classes=RUNTIME_CLASSES,
                    pod_pids_limit=Limits().pids,
                    seccomp_root=seccomp_root,
                    agent_sandbox=agent_sandbox,
                ).start()
            except docker.errors.DockerException as exc:
                shutil.rmtree(directory, ignore_errors=True)
                raise BackendUnavailable(f"the Kubernetes API test double needs a Docker engine: {exc}") from exc
            started.write_kubeconfig(directory / "kubeconfig")
            _doubles[agent_sandbox] = (started, directory)
        return _doubles[agent_sandbox][0]


def kubeconfig(agent_sandbox: bool = False) -> Path:
    double(agent_sandbox)
    return _doubles[agent_sandbox][1] / "kubeconfig"


def stop() -> None:
    with _lock:
        for started, directory in _doubles.values():
            try:
                started.stop()
            finally:
                shutil.rmtree(directory, ignore_errors=True)
        _doubles.clear()
