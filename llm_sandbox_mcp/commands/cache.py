"""`llm-sandbox-mcp cache list|prune`: the library caches on this host, and removing those not used lately."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import anyio.to_thread

from llm_sandbox_mcp.backends import select_backend
from llm_sandbox_mcp.cache_index import CacheEntry, CacheIndex
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    cache = add("cache", help="list or prune the library caches on this host")
    commands = cache.add_subparsers(dest="cache_command", required=True)
    commands.add_parser(
        "list", help="every library cache: engine, language, size, when last used, libraries, principal over HTTP"
    )
    prune = commands.add_parser("prune", help="remove library caches of the configured engine not used lately")
    prune.add_argument(
        "--older-than", type=float, default=24.0, metavar="HOURS", help="unused for this long (default 24)"
    )
    prune.add_argument(
        "--all", action="store_true", help="every cache of the engine, even one a running session may use"
    )


def _line(entry: CacheEntry, now: float) -> str:
    idle = (now - entry.last_used) / 3600
    libraries = ", ".join(entry.libraries) or "(none: the language's own build cache)"
    owner = f"  (principal {entry.owner})" if entry.owner else ""
    return (
        f"{entry.engine:<11} {entry.key[:12]}  {entry.language:<10} {entry.size_bytes / 1024**2:>8.1f} MiB  "
        f"used {idle:>6.1f} h ago  {libraries}{owner}\n"
    )


async def run(settings: Settings, args: argparse.Namespace) -> int:
    index = CacheIndex()
    entries = await anyio.to_thread.run_sync(index.entries, None)
    now = time.time()
    if args.cache_command == "list":
        for entry in entries:
            sys.stdout.write(_line(entry, now))
        total = sum(entry.size_bytes for entry in entries)
        sys.stdout.write(f"{len(entries)} caches, {total / 1024**2:.1f} MiB ({index.path})\n")
        return 0
    try:
        backend, _ = await select_backend(settings)
    except SandboxError as exc:
        sys.stderr.write(f"llm-sandbox-mcp: {exc}\n")
        return 2
    removed = 0
    try:
        for entry in entries:
            if entry.engine != backend.name or (not args.all and now - entry.last_used < args.older_than * 3600):
                continue
            await backend.drop_cache(entry.key)
            await anyio.to_thread.run_sync(index.forget, entry.engine, entry.key)
            sys.stdout.write("removed " + _line(entry, now))
            removed += 1
    finally:
        await backend.aclose()
    sys.stdout.write(f"{removed} caches removed from {backend.name}\n")
    return 0
