"""Each engine mounts a sandbox's egress socket directory read-only at EGRESS_DIR, and keeps it without network."""

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
from llm_sandbox_mcp.backends._docker import DockerEngine, container_options
from llm_sandbox_mcp.backends._podman.libpod import container_spec
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import EGRESS_DIR, Limits, SandboxSpec

SPEC = SandboxSpec("image", Limits(), egress="/tmp/llm-sandbox-egress-x")


def test_docker_binds_the_socket_directory_read_only_with_no_network() -> None:
    options = container_options(SPEC, {})
    assert options["network_mode"] == "none"
    [mount] = options["mounts"]
    assert (mount["Target"], mount["Source"], mount["Type"], mount["ReadOnly"]) == (
        str(EGRESS_DIR), "/tmp/llm-sandbox-egress-x", "bind", True
    )  # fmt: skip


def test_podman_binds_the_socket_directory_read_only_with_no_network() -> None:
    body = container_spec(SPEC, {})
    assert body["netns"] == {"nsmode": "none"}
    assert {"destination": str(EGRESS_DIR), "type": "bind", "source": "/tmp/llm-sandbox-egress-x",
            "options": ["ro", "nosuid", "nodev"]} in body["mounts"]  # fmt: skip


def test_bubblewrap_keeps_its_own_network_namespace_and_binds_the_socket_directory() -> None:
    bwrap = Bwrap(Path("/usr/bin/bwrap"), (0, 8, 0), "system", "/usr/bin/bwrap")
    argv = holder_argv(bwrap, SPEC, info_fd=5, file_fds={}, cache_dir=None)
    assert "--share-net" not in argv and "/etc/resolv.conf" not in argv
    at = argv.index(str(EGRESS_DIR))
    assert argv[at - 2 : at + 1] == ["--ro-bind", "/tmp/llm-sandbox-egress-x", str(EGRESS_DIR)]


def test_a_remote_docker_engine_cannot_mount_the_socket() -> None:
    with pytest.raises(SandboxFailure, match="cannot mount it"):
        DockerEngine("tcp://192.0.2.1:2375").create(SPEC, lambda _: None)
