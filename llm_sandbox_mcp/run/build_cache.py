"""Built programs kept by the server, so that a Go or C++ program already built is run, not built again.

An entry is the binary a build produced in a pristine one-shot sandbox, handed to the supervisor by the run
script before the program started (runners/go_run.sh), keyed by everything the build depends on: language,
image (its id where the engine has one, the host compiler's file where the backend runs the host's), library
store, run script, environment and source; and by the principal whose call built it (no one's build is a hit
for another: its speed would tell them that someone ran the same program). Kept in this server's memory, not
on disk: nothing else on the host can swap an entry, entries die with the server, and the bound is plain
(bytes and entries, least recently used first out, the storing principal's own first). Sessions never use it:
their workspace files can be part of a build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass

from llm_sandbox_mcp.backends import Backend, ImageBuilder, RuntimeProbe
from llm_sandbox_mcp.languages import Language, runner_source, sandbox_env
from llm_sandbox_mcp.models import SandboxSpec

# The languages whose run script speaks the build protocol, and the runner files that script is made of.
RUN_SCRIPTS = {"go": ("go_run.sh",), "cpp": ("cpp_flags.sh", "cpp_run.sh")}
# The run script's environment variable naming its build pipe (the supervisor opens it as fd 3).
BUILD_PIPE_ENV = {"LLM_SANDBOX_BUILD_PIPE": "3"}
MAX_BINARY = 64 * 1024**2
MAX_ENTRIES = 256
# The PATH sandboxes of host-runtime backends (bubblewrap, NsJail) find the compiler on.
_HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The host's package databases: any package installed, upgraded or removed (headers too) changes them.
_PACKAGE_DATABASES = ("/var/lib/dpkg/status", "/var/lib/rpm/rpmdb.sqlite", "/lib/apk/db/installed")
# How long an image's id or a host compiler's identity is trusted before it is looked up again.
_IDENTITY_SECONDS = 5.0
# Sources whose build differs from one build to the next, or reads files from outside the workspace.
_UNCACHEABLE = {"cpp": (b"__TIME__", b"__DATE__", b"__TIMESTAMP__", b'#include "/', b"#include </")}
_KEY_VERSION = 1


@dataclass(frozen=True)
class Plan:
    """How one run builds: `binary` from the cache (a hit), or a build that hands its binary over (`key` set)."""

    key: str | None
    binary: bytes | None = None
    # The largest binary this build may hand over.
    limit: int = 0
    # Whose build it is.
    owner: str = ""

    @property
    def mode(self) -> str:
        """The first line the run script reads (runners/go_run.sh)."""
        return "built" if self.binary is not None else "capture" if self.key else "build"


class BuildCache:
    """Binaries by key, bounded by `size` bytes (0: off) and MAX_ENTRIES; least recently used go first, those of
    the principal storing one before anyone else's."""

    def __init__(self, backend: Backend, size: int) -> None:
        self.backend = backend
        self.size = size
        self.limit = min(MAX_BINARY, size)
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._owners: dict[str, str] = {}
        self._bytes = 0
        self._identities: dict[str, tuple[float, str]] = {}
        self.hits = 0
        self.stores = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    async def plan(
        self, lang: Language, spec: SandboxSpec, source: bytes, lookup: bool = True, owner: str = ""
    ) -> Plan:
        """The plan of `owner`'s one-shot run of `source`: a hit unless `lookup` is false, else a build to keep."""
        if not self.size or any(marker in source for marker in _UNCACHEABLE.get(lang.name, ())):
            return Plan(None)
        key = await self.key(lang, spec, source, owner)
        binary = self.get(key) if lookup else None
        # A hit holds the binary in the runner's memory and the workspace while it is written: a binary too
        # large for the sandbox's memory would end the run there instead of running it.
        return Plan(key, binary, min(self.limit, spec.limits.memory_bytes // 8), owner)

    async def key(self, lang: Language, spec: SandboxSpec, source: bytes, owner: str = "") -> str:
        identity = [
            _KEY_VERSION,
            lang.name,
            spec.image,
            await self._identity(lang, spec.image),
            spec.cache.key if spec.cache is not None else None,
            hashlib.sha256("".join(map(runner_source, RUN_SCRIPTS[lang.name])).encode()).hexdigest(),
            sandbox_env(lang, with_libraries=spec.cache is not None),
            hashlib.sha256(source).hexdigest(),
            owner,
        ]
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> bytes | None:
        binary = self._entries.get(key)
        if binary is not None:
            self._entries.move_to_end(key)
            self.hits += 1
        return binary

    def put(self, key: str, binary: bytes, limit: int | None = None, owner: str = "") -> bool:
        """Keep `owner`'s `binary`; False when it is empty or larger than one entry (or `limit`) may be."""
        if not binary or len(binary) > min(self.limit, self.limit if limit is None else limit):
            return False
        self.forget(key)
        self._entries[key] = binary
        self._owners[key] = owner
        self._bytes += len(binary)
        while self._bytes > self.size or len(self._entries) > MAX_ENTRIES:
            mine = (old for old in self._entries if old != key and self._owners[old] == owner)
            self.forget(next(mine, next(iter(self._entries))))
        self.stores += 1
        return True

    def forget(self, key: str) -> None:
        old = self._entries.pop(key, None)
        self._owners.pop(key, None)
        if old is not None:
            self._bytes -= len(old)

    async def _identity(self, lang: Language, image: str) -> str:
        """What the image really is: its id on engines with images, the compiler's file where the host's runs."""
        subject = lang.version_argv[0] if isinstance(self.backend, RuntimeProbe) else image
        now = time.monotonic()
        cached = self._identities.get(subject)
        if cached is not None and now - cached[0] < _IDENTITY_SECONDS:
            return cached[1]
        if isinstance(self.backend, ImageBuilder):
            info = await self.backend.image_info(image)
            identity = info.id if info is not None else ""
        elif isinstance(self.backend, RuntimeProbe):
            identity = _host_file(subject)
        else:
            identity = ""  # Kubernetes: the image reference is all the server knows
        self._identities[subject] = (now, identity)
        return identity


def _host_file(executable: str) -> str:
    """The host file an executable resolves to and the host's package database, each with what changes when
    it is replaced or rewritten (a compiler upgrade, a header package installed)."""
    found = shutil.which(executable, path=_HOST_PATH)
    files = [os.path.realpath(found)] if found is not None else []
    parts: list[str] = []
    for path in [*files, *_PACKAGE_DATABASES]:
        try:
            info = os.stat(path)
        except OSError:
            continue
        parts.append(f"{path}:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}")
    return ";".join(parts)
