"""Per-sandbox cgroups (pids, memory, cpu) where this process may make them: cgroup v1 or v2.

Each server's sandboxes go under a directory of its own (`server-<pid>-<instance>`, under the shared
`llm-sandbox-mcp`), whose memory limit is the server's memory budget once the budget asks for it
(`CgroupManager.hold_within`): the kernel then bounds all of them together, not only each.

Root can always make them, and root is exactly the case where rlimits fail (root ignores RLIMIT_NPROC).
Without all three the backend refuses to run: rlimits alone bound neither shared memory nor CPU. All calls
block; the backend runs them in worker threads.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llm_sandbox_mcp.backends._cgroup_memory import (
    PARENT,
    cgroup_mounts,
    memory_in_use,
    server_alive,
    write_memory_limit,
)
from llm_sandbox_mcp.backends._owner import INSTANCE_ID
from llm_sandbox_mcp.models import Limits

logger = logging.getLogger(__name__)

CONTROLLERS = ("pids", "memory", "cpu")
SERVER_PREFIX = "server-"
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Hierarchy:
    """Where one or more controllers are mounted, and the directory our sandboxes go under."""

    version: int
    controllers: frozenset[str]
    parent: Path


@dataclass(frozen=True)
class Cgroup:
    """One sandbox's cgroup directories, one per hierarchy."""

    dirs: tuple[Path, ...]
    controllers: frozenset[str]

    def place(self, pid: int) -> None:
        """Move a process (and so everything it starts later) into the sandbox's cgroups."""
        for directory in self.dirs:
            (directory / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in (directory / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL every member until none is left (a fork bomb refills slots only while a member lives)."""
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                (directory / "cgroup.kill").write_text("1")
        for _ in range(1000):
            members = self.pids()
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        logger.warning("Processes still alive in %s after repeated SIGKILL", self.dirs[0])

    def remove(self) -> None:
        """Kill what is left and remove the directories; an empty cgroup can take a moment to let go."""
        self.kill()
        for directory in self.dirs:
            for _ in range(500):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        logger.warning("Could not remove cgroup %s: %s", directory, exc)
                        break
                    time.sleep(0.01)


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller, and under "" its v2 cgroup."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _under(mount_root: str, mount_point: str, path: str) -> Path:
    relative = os.path.relpath(path, mount_root)
    if relative == ".":
        return Path(mount_point)
    if relative.startswith(".."):
        # Our cgroup lies outside what this mount shows (a cgroup namespace): its root is the closest we get.
        return Path(mount_point)
    return Path(mount_point) / relative


def discover() -> list[Hierarchy]:
    """The hierarchies that hold pids, memory or cpu, preferring v1 mounts (hybrid hosts bind them there)."""
    try:
        mounts, own = cgroup_mounts(), _own_paths()
    except OSError:
        return []
    # A server that is not root keeps to a directory of its own: one delegated to it (see `cgroup_fix`) is
    # never one a root server's sandboxes live in.
    parent = PARENT if os.geteuid() == 0 else f"{PARENT}-{os.geteuid()}"
    hierarchies: list[Hierarchy] = []
    claimed: set[str] = set()
    for root, point, fstype, options in mounts:
        wanted = frozenset(options & set(CONTROLLERS)) - claimed
        if fstype == "cgroup" and wanted:
            # Nested under our own cgroup: any limit our parent has still applies to the sandboxes.
            own_path = own.get(sorted(wanted)[0], "/")
            hierarchies.append(Hierarchy(1, wanted, _under(root, point, own_path) / parent))
            claimed |= wanted
    for root, point, fstype, _ in mounts:
        if fstype != "cgroup2" or root != "/":
            continue
        with contextlib.suppress(OSError):
            available = set((Path(point) / "cgroup.controllers").read_text().split())
            wanted = frozenset(available & set(CONTROLLERS)) - claimed
            if wanted:
                # v2 forbids processes in a cgroup that delegates controllers, so not under our own cgroup.
                hierarchies.append(Hierarchy(2, wanted, Path(point) / parent))
                claimed |= wanted
    return hierarchies


def _enable(directory: Path, controllers: Iterable[str]) -> None:
    control = directory / "cgroup.subtree_control"
    enabled = set(control.read_text().split())
    missing = [name for name in controllers if name not in enabled]
    if missing:
        control.write_text(" ".join(f"+{name}" for name in missing))


def _write_limits(directory: Path, version: int, controllers: frozenset[str], limits: Limits) -> None:
    if "pids" in controllers:
        (directory / "pids.max").write_text(str(limits.pids))
    if "memory" in controllers:
        if version == 1:
            (directory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            swap = directory / "memory.memsw.limit_in_bytes"
        else:
            (directory / "memory.max").write_text(str(limits.memory_bytes))
            swap = directory / "memory.swap.max"
        if swap.exists():
            swap.write_text(str(limits.memory_bytes) if version == 1 else "0")
    if "cpu" in controllers:
        quota = max(1000, int(limits.cpus * _CPU_PERIOD_US))
        if version == 1:
            (directory / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
            (directory / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (directory / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")


class CgroupManager:
    """Makes the per-sandbox cgroups, or says why it cannot."""

    def __init__(self, hierarchies: list[Hierarchy] | None = None, memory_total: int | None = None) -> None:
        self.hierarchies = discover() if hierarchies is None else hierarchies
        self.server = f"{SERVER_PREFIX}{os.getpid()}-{INSTANCE_ID}"
        # The limit over all of this server's sandboxes, once written (`hold_within`).
        self.memory_total: int | None = None
        self.problem: str | None = None if self.hierarchies else "no cgroup hierarchy with pids, memory or cpu"
        if not self.problem:
            try:
                self._prepare()
            except OSError as exc:
                self._fail(exc)
        if memory_total is not None:
            self.hold_within(memory_total)

    def _server_dir(self, hierarchy: Hierarchy) -> Path:
        return hierarchy.parent / self.server

    def _memory(self) -> Hierarchy | None:
        return next((h for h in self.hierarchies if "memory" in h.controllers), None)

    def hold_within(self, total: int) -> None:
        """Limit the memory of all of this server's sandboxes together to `total` bytes (where it can)."""
        memory = self._memory()
        if self.problem or memory is None:
            return
        try:
            write_memory_limit(self._server_dir(memory), memory.version, total)
        except OSError as exc:
            logger.warning("No memory limit over all sandboxes (%s); the budget counts their limits", exc)
            return
        self.memory_total = total

    def _remake(self, hierarchy: Hierarchy) -> None:
        """This server's directory again, limit included, where another server's sweep took it while empty (a
        server of another PID namespace cannot tell that this one runs)."""
        server_dir = self._server_dir(hierarchy)
        server_dir.mkdir(parents=True, exist_ok=True)
        if hierarchy.version == 2:
            _enable(server_dir, hierarchy.controllers)
        if "memory" in hierarchy.controllers and self.memory_total is not None:
            write_memory_limit(server_dir, hierarchy.version, self.memory_total)

    def in_use(self) -> int | None:
        """What this server's sandboxes use together (bytes), or None while no limit holds them all."""
        memory = self._memory()
        if self.memory_total is None or memory is None:
            return None
        try:
            return memory_in_use(self._server_dir(memory), memory.version)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Remove this server's directories (its sandboxes' are gone by now)."""
        for hierarchy in self.hierarchies:
            with contextlib.suppress(OSError):
                self._server_dir(hierarchy).rmdir()

    def sweep_servers(self) -> None:
        """Remove the empty directories of servers on this host that no longer run."""
        for hierarchy in self.hierarchies:
            with contextlib.suppress(OSError):
                for directory in hierarchy.parent.glob(f"{SERVER_PREFIX}*"):
                    if directory.name != self.server and not server_alive(directory.name):
                        # Only what is empty: the sandboxes of a dead server are killed by the sweep of its
                        # state records, which knows their owner; a pid here may be of another PID namespace.
                        for leftover in directory.iterdir():
                            with contextlib.suppress(OSError):
                                leftover.rmdir()
                        with contextlib.suppress(OSError):
                            directory.rmdir()

    def missing(self) -> str | None:
        """Why sandboxes here would not get a pids, memory and CPU limit each, or None when they will."""
        if self.problem:
            return self.problem
        found = {name for hierarchy in self.hierarchies for name in hierarchy.controllers}
        absent = [name for name in CONTROLLERS if name not in found]
        return f"no {', '.join(absent)} cgroup controller" if absent else None

    def describe(self) -> str:
        if self.problem:
            return f"no cgroups ({self.problem})"
        parts = [f"v{h.version} {'+'.join(sorted(h.controllers))}" for h in self.hierarchies]
        return "cgroups " + ", ".join(parts)

    def _prepare(self) -> None:
        for hierarchy in self.hierarchies:
            if hierarchy.version == 2:
                _enable(hierarchy.parent.parent, hierarchy.controllers)
            hierarchy.parent.mkdir(exist_ok=True)
            if not os.access(hierarchy.parent, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(hierarchy.parent))
            if hierarchy.version == 2:
                _enable(hierarchy.parent, hierarchy.controllers)
            self._server_dir(hierarchy).mkdir(exist_ok=True)
            if hierarchy.version == 2:
                _enable(self._server_dir(hierarchy), hierarchy.controllers)

    def _fail(self, exc: OSError) -> None:
        self.problem = f"cannot create cgroups here ({exc.strerror}: {exc.filename})"
        logger.warning("No sandbox cgroups can be made here: %s", self.problem)

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        """The sandbox's cgroups with its limits written, or None (and `problem` set) when they cannot be made."""
        if self.problem:
            return None
        made: list[Path] = []
        try:
            for hierarchy in self.hierarchies:
                if not self._server_dir(hierarchy).is_dir():
                    self._remake(hierarchy)
                directory = self._server_dir(hierarchy) / name
                directory.mkdir()
                made.append(directory)
                _write_limits(directory, hierarchy.version, hierarchy.controllers, limits)
        except OSError as exc:
            for directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            self._fail(exc)
            return None
        controllers = frozenset(name for h in self.hierarchies for name in h.controllers)
        return Cgroup(tuple(made), controllers)


def existing(dirs: Iterable[str]) -> Cgroup:
    """A Cgroup for directories recorded earlier (by this or a dead server), to kill and remove."""
    return Cgroup(tuple(Path(d) for d in dirs), frozenset())
