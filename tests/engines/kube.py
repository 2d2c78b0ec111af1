"""The Kubernetes "engine" of the engine tier: one API server test double (tests/support/k8s_double) per test session.

Started on first use, so runs that select no Kubernetes test start nothing; `stop()` (a session fixture in
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
_double: KubeApiDouble | None = None
_directory: Path | None = None


def double() -> KubeApiDouble:
    """The session's double, started on first call. Raises BackendUnavailable when Docker is missing."""
    global _double, _directory
    with _lock:
        if _double is None:
            directory = Path(tempfile.mkdtemp(prefix="llm-sandbox-kube-"))
            seccomp_root = directory / "seccomp"
            seccomp_root.mkdir()
            (seccomp_root / SECCOMP_PROFILE.removeprefix("localhost/")).write_text(PROFILE_JSON)
            try:
                started = KubeApiDouble(
                    runtime_classes=RUNTIME_CLASSES, pod_pids_limit=Limits().pids, seccomp_root=seccomp_root
                ).start()
            except docker.errors.DockerException as exc:
                shutil.rmtree(directory, ignore_errors=True)
                raise BackendUnavailable(f"the Kubernetes API test double needs a Docker engine: {exc}") from exc
            _directory = directory
            started.write_kubeconfig(_directory / "kubeconfig")
            _double = started
        return _double


def kubeconfig() -> Path:
    double()
    assert _directory is not None
    return _directory / "kubeconfig"


def stop() -> None:
    global _double, _directory
    with _lock:
        if _double is not None:
            _double.stop()
            _double = None
        if _directory is not None:
            shutil.rmtree(_directory, ignore_errors=True)
            _directory = None
