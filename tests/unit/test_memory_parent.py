"""The cgroup over all of a server's sandboxes, on directories laid out as cgroupfs lays them out (the kernel's own
behaviour is proven on real engines by tests/engines/test_memory_budget.py)."""

from __future__ import annotations

import os
from pathlib import Path

from llm_sandbox_mcp.backends._cgroup_memory import ContainerParent, memory_in_use, memory_limit
from llm_sandbox_mcp.backends._daemonless.cgroup import CgroupManager, Hierarchy
from llm_sandbox_mcp.models import Limits

GIB = 1024**3


def _manager(tmp_path: Path, total: int | None = GIB) -> CgroupManager:
    return CgroupManager([Hierarchy(1, frozenset({"memory"}), tmp_path / "llm-sandbox-mcp")], memory_total=total)


def test_a_servers_sandboxes_go_under_its_own_directory_whose_limit_is_the_budget(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    server = tmp_path / "llm-sandbox-mcp" / manager.server
    cgroup = manager.create("sandbox-1", Limits())
    assert cgroup is not None and cgroup.dirs == (server / "sandbox-1",)
    assert memory_limit(server, 1) == GIB
    (server / "memory.usage_in_bytes").write_text(str(300 * 2**20))
    (server / "memory.stat").write_text("cache 1\ntotal_inactive_file 104857600\n")
    assert manager.in_use() == 200 * 2**20  # less the file cache the kernel reclaims first


def test_without_a_limit_over_all_of_them_nothing_is_measured(tmp_path: Path) -> None:
    manager = _manager(tmp_path, total=None)
    assert manager.in_use() is None
    assert CgroupManager([]).in_use() is None


def test_a_directory_another_server_swept_is_made_again_with_its_limit(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    server = tmp_path / "llm-sandbox-mcp" / manager.server
    for item in server.iterdir():
        item.unlink()
    server.rmdir()
    assert manager.create("sandbox-2", Limits()) is not None
    assert memory_limit(server, 1) == GIB


def test_the_sweep_takes_only_empty_directories_of_servers_that_are_gone(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    parent = tmp_path / "llm-sandbox-mcp"
    gone, alive, busy = (
        parent / "server-999999999-a",
        parent / f"server-{os.getppid()}-b",
        parent / "server-999999998-c",
    )
    for directory in (gone / "sandbox-x", alive, busy):
        directory.mkdir(parents=True)
    (busy / "cgroup.procs").write_text("1\n")  # a plain file: as a cgroup with members, it cannot be removed
    manager.sweep_servers()
    assert not gone.exists() and alive.is_dir() and busy.is_dir() and (parent / manager.server).is_dir()


def test_a_container_parent_notices_a_lost_limit_and_writes_it_again(tmp_path: Path) -> None:
    parent = ContainerParent("docker", 1, tmp_path, GIB)
    parent.ensure()
    assert parent.name.startswith("/llm-sandbox-mcp/docker-") and memory_limit(parent.memory_dir, 1) == GIB
    (parent.memory_dir / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # made again by the engine
    parent.ensure()
    assert memory_limit(parent.memory_dir, 1) == GIB
    (parent.memory_dir / "memory.current").write_text("5")
    (parent.memory_dir / "memory.stat").write_text("inactive_file 2\n")
    assert memory_in_use(parent.memory_dir, 2) == 3
