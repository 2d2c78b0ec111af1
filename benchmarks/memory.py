"""Memory: the server's own at idle, and what one warm sandbox of each language holds while it waits in the pool.

    BACKEND=bubblewrap python benchmarks/memory.py [--languages python,go] [--json out.json]

For each language a server is started over stdio (the official client, as a user's), makes one call of that
language so the pool warms its kind, and is measured once its pool holds `SANDBOX_POOL_SIZE` sandboxes that
have stopped growing: the server's RSS, and per sandbox the memory its cgroup is charged (what
`SANDBOX_MEM_LIMIT` and `SANDBOX_MEMORY_BUDGET` count: the runtime's pages, its page cache and tmpfs; on
Docker and Podman without the inactive page cache, as `docker stats` shows it) and the resident set of its
processes. Docker and Podman sandboxes are read from the engine's stats; bubblewrap and
NsJail from the cgroups their state records name.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from result_files import record as record_result

from llm_sandbox_mcp.backends._daemonless.host import state_root
from llm_sandbox_mcp.backends._owner import PID

MIB = 1024**2
HELLO = {
    "python": "print(1)",
    "javascript": "console.log(1)",
    "ruby": "puts 1",
    "r": "cat(1)",
    "java": "public class Main { public static void main(String[] a) { System.out.println(1); } }",
    "go": 'package main\nimport "fmt"\nfunc main() { fmt.Println(1) }\n',
    "cpp": '#include <cstdio>\nint main() { std::puts("1"); }\n',
}
_SETTLE_SECONDS = 120.0


def children_of(pid: int) -> Iterator[int]:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            yield int(stat.parent.name)


def server_of(parent: int) -> list[int]:
    """The server process the client started (its child running the console script)."""
    found: list[int] = []
    for pid in children_of(parent):
        try:
            if "llm-sandbox-mcp" in Path(f"/proc/{pid}/cmdline").read_text():
                found.append(pid)
        except OSError:
            continue
    return found


def rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def cgroup_charge(directory: Path) -> int:
    for name in ("memory.current", "memory.usage_in_bytes"):
        if (directory / name).is_file():
            return int((directory / name).read_text())
    return 0


def host_sandboxes(server_pid: int) -> list[dict[str, int]]:
    """bubblewrap and NsJail: the server's state records name each sandbox's cgroups."""
    found: list[dict[str, int]] = []
    for record in (state_root() / "sandboxes").glob("*.json"):
        try:
            state = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if state.get("labels", {}).get(PID) != str(server_pid):
            continue
        dirs = [Path(d) for d in state.get("cgroups", [])]
        charged = max((cgroup_charge(d) for d in dirs), default=0)
        pids: set[int] = set()
        for directory in dirs:
            procs = directory / "cgroup.procs"
            if procs.is_file():
                pids.update(int(p) for p in procs.read_text().split())
        found.append({"charged": charged, "rss": sum(rss(p) for p in pids)})
    return found


def container_memory(backend: str, container: Any) -> dict[str, int]:
    if backend == "podman":  # libpod's own stats: usage as `podman stats` shows it
        stats: dict[str, Any] = container.stats(stream=False, decode=True)
        usage = int(stats["Stats"][0]["MemUsage"])
        top = container.top(ps_args="pid,rss")
    else:  # as `docker stats` shows it: without the inactive page cache the kernel reclaims first
        memory = container.stats(stream=False).get("memory_stats", {})
        inner: dict[str, Any] = memory.get("stats", {})
        inactive = int(inner.get("total_inactive_file", inner.get("inactive_file", 0)))
        usage = int(memory.get("usage", 0)) - inactive
        top = container.top(ps_args="-o pid,rss")
    titles = top.get("Titles", [])
    column = titles.index("RSS") if "RSS" in titles else None
    resident = 0
    if column is not None:
        resident = sum(int(row[column]) * 1024 for row in top.get("Processes", []) if row[column].isdigit())
    return {"charged": usage, "rss": resident}


def engine_sandboxes(backend: str, server_pid: int) -> list[dict[str, int]]:
    """Docker and Podman: the engine's own accounting of each container of this server."""
    if backend == "podman":
        from podman import PodmanClient

        client: Any = PodmanClient(base_url=os.environ.get("CONTAINER_HOST", "unix:///run/podman/podman.sock"))
    else:
        import docker

        client = docker.from_env()
    found: list[dict[str, int]] = []
    try:
        for container in client.containers.list(filters={"label": f"{PID}={server_pid}"}):
            try:
                found.append(container_memory(backend, container))
            except Exception:  # a sandbox the pool disposed of meanwhile
                continue
    finally:
        client.close()
    return found


def sandboxes(backend: str, server_pid: int) -> list[dict[str, int]]:
    if backend in ("bubblewrap", "nsjail"):
        return host_sandboxes(server_pid)
    return engine_sandboxes(backend, server_pid)


async def measure(backend: str, language: str, pool_size: int) -> dict[str, Any]:
    env = {**os.environ, "BACKEND": backend, "SANDBOX_POOL_SIZE": str(pool_size), "SANDBOX_LOG_LEVEL": "WARNING"}
    params = StdioServerParameters(command=str(Path(sys.executable).parent / "llm-sandbox-mcp"), env=env)
    async with Client(params) as client:
        await client.list_tools()
        (server_pid,) = await anyio.to_thread.run_sync(server_of, os.getpid())
        await anyio.sleep(2)
        idle = rss(server_pid)
        result = await client.call_tool("execute_code", {"language": language, "code": HELLO[language], "timeout": 120})
        if result.is_error:
            raise SystemExit(f"{language}: {result.content}")
        deadline = time.monotonic() + _SETTLE_SECONDS
        previous: list[int] = []
        while True:
            await anyio.sleep(3)
            found = await anyio.to_thread.run_sync(sandboxes, backend, server_pid)
            charges = sorted(item["charged"] for item in found)
            if (len(found) >= pool_size and charges == previous) or time.monotonic() > deadline:
                break
            previous = charges
        return {
            "server_idle_rss_mib": round(idle / MIB, 1),
            "server_rss_mib": round(rss(server_pid) / MIB, 1),
            "sandboxes": len(found),
            "charged_mib": round(statistics.median(item["charged"] for item in found) / MIB, 1) if found else None,
            "rss_mib": round(statistics.median(item["rss"] for item in found) / MIB, 1) if found else None,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default=",".join(HELLO))
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    backend = os.environ.get("BACKEND", "docker")
    report: dict[str, Any] = {
        "backend": backend,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}",
    }
    rows: dict[str, Any] = {}
    for language in args.languages.split(","):
        rows[language] = anyio.run(measure, backend, language, args.pool_size)
    report["languages"] = rows
    lines = [
        f"{backend} on {report['machine']}; pool size {args.pool_size}",
        "| language | per warm sandbox: charged / resident (MiB) | server RSS idle / with the pool (MiB) |",
        "|---|---|---|",
    ]
    for language, row in rows.items():
        per_sandbox = f"{row['charged_mib']} / {row['rss_mib']}"
        lines.append(f"| {language} | {per_sandbox} | {row['server_idle_rss_mib']} / {row['server_rss_mib']} |")
    sys.stdout.write("\n".join(lines) + "\n")
    record_result("memory", backend, report, args.results)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
