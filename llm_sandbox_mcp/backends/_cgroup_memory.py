"""The memory side of one parent cgroup over all of this server's sandboxes: its limit (the server's memory
budget) and what its members use together. Shared by the engines that can put their sandboxes under such a
parent: Docker and Podman (a cgroup parent of the engine's containers), bubblewrap and NsJail (their own
cgroups). Blocking file access: a read or two of cgroupfs, which never waits on a disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from llm_sandbox_mcp.backends._owner import INSTANCE_ID

logger = logging.getLogger(__name__)

# The directory every cgroup of this project goes under, in each hierarchy.
PARENT = "llm-sandbox-mcp"

# Read from memory.stat: file pages the kernel reclaims first, as `docker stats` leaves them out of use.
_INACTIVE_FILE = {1: "total_inactive_file", 2: "inactive_file"}


def cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fs type, super options) of every cgroup mount of this process."""
    found: list[tuple[str, str, str, set[str]]] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            mount_point = fields[4].replace("\\040", " ")
            found.append((fields[3], mount_point, tail[0], set(tail[2].split(","))))
    return found


def memory_root() -> tuple[int, Path] | None:
    """The cgroup version and mount point of the host's memory controller (its root hierarchy), or None."""
    try:
        mounts = cgroup_mounts()
    except OSError:
        return None
    for root, point, fstype, options in mounts:
        if fstype == "cgroup" and "memory" in options and root == "/":
            return 1, Path(point)
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and root == "/":
            with contextlib.suppress(OSError):
                if "memory" in (Path(point) / "cgroup.controllers").read_text().split():
                    return 2, Path(point)
    return None


def write_memory_limit(directory: Path, version: int, limit: int) -> None:
    """`limit` bytes for the cgroup at `directory` and everything under it, swap included (none)."""
    if version == 1:
        # Without hierarchical accounting (old hosts' default) a parent's limit would not bound its children.
        hierarchical = directory / "memory.use_hierarchy"
        if hierarchical.exists() and hierarchical.read_text().strip() != "1":
            hierarchical.write_text("1")
        (directory / "memory.limit_in_bytes").write_text(str(limit))
        swap = directory / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(limit))
    else:
        (directory / "memory.max").write_text(str(limit))
        swap = directory / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")


def memory_limit(directory: Path, version: int) -> int | None:
    """The memory limit of the cgroup at `directory` in bytes, None when unlimited."""
    text = (directory / ("memory.limit_in_bytes" if version == 1 else "memory.max")).read_text().strip()
    if text == "max":
        return None
    value = int(text)
    return None if value >= 2**62 else value


def memory_in_use(directory: Path, version: int) -> int:
    """What the cgroup at `directory` and everything under it use, less the inactive file cache."""
    usage = int((directory / ("memory.usage_in_bytes" if version == 1 else "memory.current")).read_text())
    inactive = 0
    for line in (directory / "memory.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == _INACTIVE_FILE[version]:
            inactive = int(value)
            break
    return max(0, usage - inactive)


def server_alive(name: str) -> bool:
    """Whether the server a `<kind>-<pid>-<instance>` directory names still runs (a pid reused keeps it)."""
    try:
        os.kill(int(name.split("-")[1]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _hierarchy_roots() -> list[Path]:
    """The root of every cgroup hierarchy mounted here (each v1 controller's, the v2 one)."""
    with contextlib.suppress(OSError):
        return [Path(point) for root, point, _, _ in cgroup_mounts() if root == "/"]
    return []


def _remove_empty(directory: Path) -> None:
    """Remove a cgroup and the cgroups below it, those that are empty (rmdir refuses any with members)."""
    with contextlib.suppress(OSError):
        for child in directory.iterdir():
            if child.is_dir():
                _remove_empty(child)
    with contextlib.suppress(OSError):
        directory.rmdir()


class ContainerParent:
    """The cgroup parent of an engine's containers (the engine's cgroupfs driver places each container's cgroup
    under it), made by this server with its memory limit. It holds only where the engine runs on this host's
    kernel: `contains` checks that a container did land in it."""

    def __init__(self, engine: str, version: int, root: Path, total: int) -> None:
        self.relative = f"{PARENT}/{engine}-{os.getpid()}-{INSTANCE_ID}"
        self.version = version
        self.memory_dir = root / self.relative
        self.total = total

    @property
    def name(self) -> str:
        """The engine's cgroup parent option (a path from the hierarchies' roots)."""
        return f"/{self.relative}"

    @classmethod
    def make(cls, engine: str, driver: str, version: int, total: int) -> ContainerParent | None:
        """The parent with `total` as its memory limit, or None (logged) where this server cannot make one the
        engine would use: another cgroup driver, another cgroup version, cgroupfs not writable here."""
        if driver != "cgroupfs":
            logger.info("No memory limit over all sandboxes: the engine's cgroup driver is %s, not cgroupfs", driver)
            return None
        found = memory_root()
        if found is None or found[0] != version:
            logger.info("No memory limit over all sandboxes: this host shows no cgroup v%d memory controller", version)
            return None
        parent = cls(engine, version, found[1], total)
        try:
            parent.ensure()
        except OSError as exc:
            logger.info("No memory limit over all sandboxes: cannot make %s (%s)", parent.memory_dir, exc)
            return None
        return parent

    def ensure(self) -> None:
        """The parent with its limit, made again where it went missing (another server's sweep takes an empty
        one whose pid it cannot see: a server of another PID namespace) or lost its limit (the engine made it
        again without one). Before each container: a stat and a read of cgroupfs."""
        written = self.total - self.total % 4096  # the kernel keeps whole pages
        if self.memory_dir.is_dir() and memory_limit(self.memory_dir, self.version) == written:
            return
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            for directory in (self.memory_dir.parent, self.memory_dir):
                with contextlib.suppress(OSError):
                    (directory / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        write_memory_limit(self.memory_dir, self.version, self.total)

    def contains(self, container_id: str) -> bool:
        """Whether the container's cgroup is in here (Docker names it by the id, Podman `libpod-<id>`)."""
        return any((self.memory_dir / name).is_dir() for name in (container_id, f"libpod-{container_id}"))

    def in_use(self) -> int | None:
        try:
            return memory_in_use(self.memory_dir, self.version)
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Remove the parent from every hierarchy (the engine made it in the others), with what the engine left
        in it empty (Podman's `conmon`); once its containers are gone."""
        for root in _hierarchy_roots():
            _remove_empty(root / self.relative)

    @staticmethod
    def sweep(engine: str) -> None:
        """Remove the empty parents of servers of this engine on this host that no longer run."""
        for root in _hierarchy_roots():
            with contextlib.suppress(OSError):
                for directory in (root / PARENT).glob(f"{engine}-*"):
                    if not server_alive(directory.name):
                        _remove_empty(directory)


class EngineMemoryLimit:
    """A container engine's side of `backends.SharedMemoryLimit` (Docker, Podman): the parent made before the first
    container, given to each, and trusted once one is seen in it."""

    def __init__(self, engine: str) -> None:
        self._engine = engine
        self._total: int | None = None
        self._parent: ContainerParent | None = None
        self._checked = False
        self._proven = False
        self._lock = threading.Lock()

    def limit(self, total: int) -> None:
        self._total = total

    def parent(self, describe: Callable[[], tuple[str, int]]) -> ContainerParent | None:
        """The parent the next container goes under, or None; `describe()`: the engine's cgroup driver and
        version, asked once. Raises OSError when the parent cannot be made again."""
        with self._lock:
            if not self._checked and self._total is not None:
                self._checked = True
                driver, version = describe()
                self._parent = ContainerParent.make(self._engine, driver, version, self._total)
            parent = self._parent
        if parent is not None:
            parent.ensure()
        return parent

    def landed(self, parent: ContainerParent, container_id: str) -> None:
        """After a container started: where it is not in the parent, the engine is on another kernel."""
        if self._proven:
            return
        if parent.contains(container_id):
            self._proven = True
            return
        logger.info("The %s containers are not in this host's cgroups; the budget counts their limits", self._engine)
        with self._lock:
            self._parent = None

    def in_use(self) -> int | None:
        parent = self._parent
        return parent.in_use() if parent is not None and self._proven else None

    def close(self) -> None:
        if self._parent is not None:
            self._parent.remove()
