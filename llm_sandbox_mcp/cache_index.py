"""The record of library caches on this host: which engine holds each, whose it is, how large it is, when it was
last used.

Shared by every server of this user on this host (several MCP clients each start one), so it is a small JSON
file updated under an exclusive lock. It is what `llm-sandbox-mcp cache list|prune` read, and what
least-recently-used eviction goes by. All functions block; callers run them in worker threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from llm_sandbox_mcp.file_lock import locked


def cache_home() -> Path:
    """$XDG_CACHE_HOME or ~/.cache; as root /var/cache (which the unprivileged sandbox user can reach); on Windows
    %LOCALAPPDATA%."""
    configured = os.environ.get("XDG_CACHE_HOME")
    if configured:
        base = Path(configured)
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif os.geteuid() == 0:
        base = Path("/var/cache")
    else:
        base = Path.home() / ".cache"
    return base / "llm-sandbox-mcp"


@dataclass(frozen=True)
class CacheEntry:
    engine: str
    key: str
    language: str
    libraries: tuple[str, ...]
    size_bytes: int
    last_used: float
    # The principal whose store it is ("" for stdio's one implicit principal, and for entries written before
    # stores had owners, which were all its).
    owner: str = ""


class CacheIndex:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_home() / "index.json"

    @contextlib.contextmanager
    def _locked(self) -> Generator[dict[str, CacheEntry]]:
        """The entries, for reading and changing; written back when the block ends without an error."""
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        with locked(self.path.with_suffix(".lock")):
            entries = self._read()
            before = dict(entries)
            yield entries
            if entries != before:
                temporary = self.path.with_suffix(".tmp")
                temporary.write_text(json.dumps([asdict(entry) for entry in entries.values()], indent=1))
                temporary.replace(self.path)

    def _read(self) -> dict[str, CacheEntry]:
        try:
            raw: Any = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        entries: dict[str, CacheEntry] = {}
        items: list[Any] = cast(list[Any], raw) if isinstance(raw, list) else []
        for item in items:
            try:
                entry = CacheEntry(
                    str(item["engine"]),
                    str(item["key"]),
                    str(item["language"]),
                    tuple(str(name) for name in item["libraries"]),
                    int(item["size_bytes"]),
                    float(item["last_used"]),
                    str(item.get("owner", "")),
                )
            except (TypeError, KeyError, ValueError, AttributeError):
                continue
            entries[f"{entry.engine}/{entry.key}"] = entry
        return entries

    def entries(self, engine: str | None = None) -> list[CacheEntry]:
        """Least recently used first."""
        with self._locked() as entries:
            found = [entry for entry in entries.values() if engine is None or entry.engine == engine]
        return sorted(found, key=lambda entry: entry.last_used)

    def record(self, entry: CacheEntry) -> None:
        with self._locked() as entries:
            entries[f"{entry.engine}/{entry.key}"] = entry

    def touch(self, engine: str, key: str) -> None:
        with self._locked() as entries:
            entry = entries.get(f"{engine}/{key}")
            if entry is not None:
                entries[f"{engine}/{key}"] = replace(entry, last_used=time.time())

    def forget(self, engine: str, key: str) -> None:
        with self._locked() as entries:
            entries.pop(f"{engine}/{key}", None)


def over_total(entries: list[CacheEntry], total: int, keep: str, recent_since: float) -> list[CacheEntry]:
    """The least recently used entries to remove so the rest fit in `total` bytes; never `keep`, and never one
    used since `recent_since` (a live session elsewhere may have it mounted)."""
    size = sum(entry.size_bytes for entry in entries)
    chosen: list[CacheEntry] = []
    for entry in sorted(entries, key=lambda e: e.last_used):
        if size <= total:
            break
        if entry.key == keep or entry.last_used >= recent_since:
            continue
        chosen.append(entry)
        size -= entry.size_bytes
    return chosen
