"""A sandbox that may reach the egress proxy gets nothing of the server's filesystem and keeps no network: on
every engine the relay's own stream is its only way out."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.platform != "linux":
    pytest.skip(
        "checks bubblewrap's mounts beside the others; bubblewrap's modules need Linux", allow_module_level=True
    )

from llm_sandbox_mcp.backends._bubblewrap.argv import holder_argv
from llm_sandbox_mcp.backends._bubblewrap.host import Bwrap
from llm_sandbox_mcp.backends._docker import container_options
from llm_sandbox_mcp.backends._podman.libpod import container_spec
from llm_sandbox_mcp.models import Limits, SandboxSpec

SPEC = SandboxSpec("image", Limits(), egress=True)
PLAIN = SandboxSpec("image", Limits())


def test_docker_mounts_nothing_more_and_keeps_no_network() -> None:
    assert container_options(SPEC, {}) == container_options(PLAIN, {})
    assert container_options(SPEC, {})["network_mode"] == "none"
    assert "mounts" not in container_options(SPEC, {})


def test_podman_mounts_nothing_more_and_keeps_no_network() -> None:
    body = container_spec(SPEC, {})
    assert body == container_spec(PLAIN, {})
    assert body["netns"] == {"nsmode": "none"}
    assert all(mount["type"] != "bind" for mount in body["mounts"])


def test_bubblewrap_mounts_nothing_more_and_keeps_its_own_network_namespace() -> None:
    bwrap = Bwrap(Path("/usr/bin/bwrap"), (0, 8, 0), "system", "/usr/bin/bwrap")
    argv = holder_argv(bwrap, SPEC, info_fd=5, file_fds={}, cache_dir=None)
    assert argv == holder_argv(bwrap, PLAIN, info_fd=5, file_fds={}, cache_dir=None)
    assert "--share-net" not in argv and "/etc/resolv.conf" not in argv
