"""Many sessions open at once: does every one answer, how fast is a cell, what does each idle one cost?

    python benchmarks/sessions.py [--sessions 128] [--backends bubblewrap,docker] [--rounds 2]

For each backend a server is started over stdio (the official client, as a user's) with
`SANDBOX_MAX_SESSIONS` set to the number of sessions and every other setting at its default, and the script:
opens that many Python sessions one after another (a refusal is counted, with its message); runs `print(1)` in
each of them in turn, `--rounds` times, back to back, and times every cell; then, the sessions idle, reads what
each one's sandbox is charged (its cgroup's usage less the inactive page cache, as `docker stats` shows it), the
cgroup over all of the server's sandboxes, the server's RSS (before the first session and now: the growth
divided by the sessions is the server's share of each), and how much MemAvailable fell on the host (which also
pays for what is outside the sandboxes' cgroups: Docker's per-container shim, for one). One result file per
backend (`sessions`); the load average is recorded before and after, as the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from bench import percentile
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from memory import rss, server_of
from result_files import record

from llm_sandbox_mcp.backends._cgroup_memory import PARENT, memory_in_use, memory_root
from llm_sandbox_mcp.backends._daemonless.host import state_root
from llm_sandbox_mcp.backends._owner import PID
from llm_sandbox_mcp.host_memory import available_memory

MIB = 1024**2
_SETTLE_SECONDS = 5.0


def _charge(directory: Path) -> int | None:
    try:
        return memory_in_use(directory, 2 if (directory / "memory.current").exists() else 1)
    except (OSError, ValueError):
        return None


def sandbox_cgroups(backend: str, server_pid: int) -> tuple[list[Path], Path | None]:
    """The memory cgroup of each sandbox of the server, and the one over all of them (None where there is none)."""
    if backend in ("bubblewrap", "nsjail"):
        found: list[Path] = []
        for record_file in (state_root() / "sandboxes").glob("*.json"):
            try:
                state = json.loads(record_file.read_text())
            except (OSError, ValueError):
                continue
            if state.get("labels", {}).get(PID) != str(server_pid):
                continue
            dirs = [Path(d) for d in state.get("cgroups", [])]
            found.extend(d for d in dirs if (d / "memory.stat").exists())
        parents = {d.parent for d in found}
        return found, parents.pop() if len(parents) == 1 else None
    root = memory_root()
    if root is None:
        return [], None
    parents = list((root[1] / PARENT).glob(f"{backend}-{server_pid}-*"))
    if not parents:
        return [], None
    return [d for d in parents[0].iterdir() if d.is_dir()], parents[0]


async def run(backend: str, sessions: int, rounds: int) -> dict[str, Any]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")},
        "BACKEND": backend,
        "SANDBOX_MAX_SESSIONS": str(sessions),
        "SANDBOX_LOG_LEVEL": "WARNING",
    }
    params = StdioServerParameters(command=str(Path(sys.executable).parent / "llm-sandbox-mcp"), env=env)
    load_before = [round(v, 2) for v in os.getloadavg()]
    available_before = available_memory() or 0
    async with Client(params) as client:
        await client.list_tools()
        (server_pid,) = await anyio.to_thread.run_sync(server_of, os.getpid())
        await client.call_tool("execute_code", {"code": "print(1)"})  # the engine up, its images ready
        await anyio.sleep(_SETTLE_SECONDS)
        server_before = rss(server_pid)
        ids: list[str] = []
        refusals: list[str] = []
        opening: list[float] = []
        for _ in range(sessions):
            started = time.perf_counter()
            created = await client.call_tool("create_session", {"language": "python"})
            opening.append((time.perf_counter() - started) * 1000)
            info: dict[str, Any] = created.structured_content or {}
            if created.is_error or not info.get("session_id"):
                shown: dict[str, Any] = created.content[0].model_dump()
                refusals.append(str(shown.get("text", ""))[:300])
                continue
            ids.append(str(info["session_id"]))
        cells: list[float] = []
        answered: set[str] = set()
        for _ in range(rounds):
            for session_id in ids:
                started = time.perf_counter()
                result = await client.call_tool("execute_code", {"code": "print(1)", "session_id": session_id})
                cells.append((time.perf_counter() - started) * 1000)
                shaped: dict[str, Any] = result.structured_content or {}
                if not result.is_error and shaped.get("stdout") == "1\n":
                    answered.add(session_id)
        await anyio.sleep(_SETTLE_SECONDS)
        dirs, parent = await anyio.to_thread.run_sync(sandbox_cgroups, backend, server_pid)
        charges = [c for c in (_charge(d) for d in dirs) if c is not None]
        server_after = rss(server_pid)
        available_after = available_memory() or 0
        all_together = _charge(parent) if parent is not None else None
        for session_id in ids:
            await client.call_tool("close_session", {"session_id": session_id})
    share = (server_after - server_before) / max(1, len(ids))
    per_sandbox = statistics.median(charges) if charges else None
    return {
        "sessions_asked": sessions,
        "sessions_opened": len(ids),
        "sessions_answered": len(answered),
        "refusals": refusals[:3],
        "open_ms": {"p50": round(percentile(opening, 0.5), 1), "p95": round(percentile(opening, 0.95), 1)},
        "cell_ms": {"p50": round(percentile(cells, 0.5), 1), "p95": round(percentile(cells, 0.95), 1)}
        if cells
        else None,
        "cells": len(cells),
        "sandboxes_measured": len(charges),
        "sandbox_charged_mib_median": round(per_sandbox / MIB, 1) if per_sandbox is not None else None,
        "all_sandboxes_charged_mib": round(all_together / MIB, 1) if all_together is not None else None,
        "server_rss_mib": {"before": round(server_before / MIB, 1), "with_sessions": round(server_after / MIB, 1)},
        "server_share_per_session_mib": round(share / MIB, 2),
        "per_session_mib": round((per_sandbox + share) / MIB, 1) if per_sandbox is not None else None,
        "host_available_fell_per_session_mib": round((available_before - available_after) / max(1, len(ids)) / MIB, 1),
        "load_average": {"before": load_before, "after": [round(v, 2) for v in os.getloadavg()]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=128)
    parser.add_argument("--backends", default="bubblewrap,docker")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", type=Path, help="directory of the result files (default: benchmarks/measured)")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        report = anyio.run(run, backend, args.sessions, args.rounds)
        sys.stdout.write(f"{backend}: {json.dumps(report)}\n")
        record("sessions", backend, report, args.results, short=args.sessions < 128)


if __name__ == "__main__":
    main()
