"""The background build's plumbing: one build per image across processes, and a build process that sees the
server's settings even where they were given in code rather than in the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.file_lock import ProcessLock
from llm_sandbox_mcp.images.detached import BuildFiles, settings_env

_HOLD = """
import sys
from pathlib import Path
from llm_sandbox_mcp.file_lock import ProcessLock
assert ProcessLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
sys.stdin.read()
"""


def test_a_build_lock_is_held_while_its_process_lives_and_free_once_it_ends_however(tmp_path: Path) -> None:
    path = tmp_path / "images" / "docker-python-0.lock"
    argv = [sys.executable, "-c", _HOLD, str(path)]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            here = ProcessLock(path)
            assert here.held_elsewhere() and not here.acquire()
            holder.kill()  # no release: the operating system drops the lock with the process
            holder.wait()
            assert not here.held_elsewhere() and here.acquire()
            here.release()
        finally:
            holder.kill()


def test_the_build_process_gets_the_settings_of_the_server_that_starts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_IMAGE_RUBY", "from/the-environment:1")  # overridden by the settings in code
    settings = Settings(
        backend="auto",
        sandbox_image_python="localhost/base:1",
        sandbox_image_build_network="host",
        sandbox_image_ruby="in/code:2",
        sandbox_pip_index_url="http://127.0.0.1:1/simple",
        sandbox_install_allow_hosts=["example.org", "*.example.com"],
        sandbox_k8s_node_selector={"pool": "sandbox", "arch": "amd64"},
        sandbox_mem_limit=768 * 1024**2,
        sandbox_read_only=False,
    )
    env = settings_env(settings, "podman")
    for key in list(Settings.model_fields):
        monkeypatch.delenv(key.upper(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child.model_dump() == {**settings.model_dump(), "backend": "podman"}


def test_progress_and_failure_come_from_the_log_as_single_clean_lines(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    files = BuildFiles(tmp_path / "build.lock", log)
    assert files.progress() == "" and files.failure() == "the build process ended"
    log.write_text(
        "== building x\n   Step 5/11 : COPY python.txt /tmp\n   Step 6/11 : RUN pip install\n"
        "   \x1b[91mDownloading numpy-2.2.6.whl\x1b[0m\u202e\n"
    )
    assert files.progress() == "step 6/11: Downloading numpy-2.2.6.whl"
    log.write_text(log.read_text() + "llm-sandbox-mcp: Docker's build of x failed: pip exited 1\nlast lines:\n")
    assert files.failure() == "Docker's build of x failed: pip exited 1"
