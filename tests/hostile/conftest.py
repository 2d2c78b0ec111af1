"""The hostile tier runs on every real engine, with the engine tier's fixtures, and after every attack proves
the host unharmed: no process of the sandbox user left on the host, and no growth of the server's memory or
the host's disk beyond a small margin.

Under pytest-xdist (scripts/test) the engines whose sandboxes share a cgroup tree on the host run on one worker,
one test at a time, beside the others: a leftover process is this test's unless its cgroup puts it in the
sandboxes of another worker's engines, or it is in none (as the daemonless sandboxes' outer processes are) and another
live server started it; a process that left both (reparented to init) still counts for every test."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_sandbox_mcp.models import Limits
from tests.engines.conftest import backend as backend
from tests.engines.conftest import engine as engine
from tests.engines.conftest import executor as executor
from tests.engines.conftest import kube_double_stopped as kube_double_stopped
from tests.engines.conftest import registry as registry
from tests.engines.conftest import select_and_group
from tests.support.memory import RssWindow

# Where each family of engines puts its sandbox processes on this host, by parts of their cgroup path
# (/proc/PID/cgroup), the first family that matches winning: Docker's and Podman's containers go under a cgroup
# parent of the server's own (`llm-sandbox-mcp/docker-<pid>-...`, `.../podman-...`, the remote engines too, being
# on this kernel), or the engine's default where it takes none (the Kubernetes double runs its pods on the Docker
# engine; both Podman services use libpod_parent); bubblewrap and NsJail under the daemonless backends' cgroup.
FAMILY_MARKERS: dict[str, tuple[str, ...]] = {
    "docker": ("/llm-sandbox-mcp/docker-", "/docker/", "/llm-sandbox-remote-docker/"),
    "podman": ("/llm-sandbox-mcp/podman-", "/libpod"),
    "daemonless": ("/llm-sandbox-mcp/",),
}
ENGINE_FAMILIES = {
    "docker": "docker",
    "kubernetes": "docker",
    "docker-remote": "docker",
    "podman": "podman",
    "podman-remote": "podman",
    "bubblewrap": "daemonless",
    "nsjail": "daemonless",
}


def family_of(cgroup: str) -> str | None:
    """The family of engines whose sandbox a process with this /proc/PID/cgroup is in, or None (in none)."""
    return next((family for family, markers in FAMILY_MARKERS.items() if any(m in cgroup for m in markers)), None)


_MARGIN = 256 * 1024**2
_SETTLE_SECONDS = 30.0


def family_group(item: pytest.Item) -> str | None:
    """One pytest-xdist group per cgroup family, so host_unharmed can tell this test's processes from the rest."""
    engine: object = getattr(getattr(item, "callspec", None), "params", {}).get("engine")
    return ENGINE_FAMILIES.get(engine) if isinstance(engine, str) else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    select_and_group(config, items, family_group)


def sandbox_user_processes(engine: str) -> list[str]:
    """Live host processes of the sandbox user (every engine runs sandboxes as that uid on this host), but for
    those in the sandboxes of another family of engines than `engine`'s, and those in no sandbox cgroup (the
    daemonless sandboxes' outer processes) that another live server started."""
    own = ENGINE_FAMILIES[engine]
    parents: dict[int, tuple[int, int]] = {}  # pid -> (parent, uid)
    candidates: list[tuple[int, str, bool]] = []  # (pid, name, in a sandbox cgroup)
    for process in Path("/proc").glob("[0-9]*"):
        try:
            status = (process / "status").read_text()
            cgroup = (process / "cgroup").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = fields.get("Uid", "").split()
        owner = int(uid[0]) if uid else -1
        parents[int(process.name)] = (int(fields.get("PPid", "0").strip() or 0), owner)
        if owner != Limits().uid or fields.get("State", "").strip().startswith("Z"):
            continue
        family = family_of(cgroup)
        if family in (None, own):
            name = fields.get("Name", "").strip()
            candidates.append((int(process.name), name, family is not None))
    return [f"{pid} {name}" for pid, name, contained in candidates if contained or not _started_elsewhere(pid, parents)]


def _started_elsewhere(pid: int, parents: dict[int, tuple[int, int]]) -> bool:
    """Whether another live process than this test's started this one: its first ancestor of another user is not
    init (an orphan counts), and this test process is none of its ancestors."""
    sandbox_uid, seen = Limits().uid, set[int]()
    while pid in parents and parents[pid][1] == sandbox_uid and pid not in seen:
        seen.add(pid)
        pid = parents[pid][0]
    if pid <= 1:
        return False
    while pid > 1 and pid not in seen:
        if pid == os.getpid():
            return False
        seen.add(pid)
        pid = parents.get(pid, (0, -1))[0]
    return True


@pytest.fixture(autouse=True)
def host_unharmed(engine: str) -> Iterator[None]:
    """Set up before the sandboxes and torn down after them, so it sees what the attack left behind (processes
    of the sandbox user that other tests left running before this one are not its concern)."""
    rss, free, before = RssWindow(), shutil.disk_usage("/").free, set(sandbox_user_processes(engine))
    yield

    def left() -> list[str]:
        return [process for process in sandbox_user_processes(engine) if process not in before]

    deadline = time.monotonic() + _SETTLE_SECONDS  # the Kubernetes double removes containers in the background
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == [], f"processes of the sandbox user outlived the {engine} sandboxes"
    assert rss.growth() < _MARGIN, "the server's memory grew past the margin (its peak during this test)"
    assert free - shutil.disk_usage("/").free < _MARGIN, "the host's disk filled past the margin"
