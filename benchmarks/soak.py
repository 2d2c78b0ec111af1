"""Minutes of mixed load: does the server stay as fast, and does it leave anything behind?

    BACKEND=bubblewrap python benchmarks/soak.py [--minutes 10] [--in-flight 8] [--library six]

One server is started over stdio (the official client, as a user's). After a warm-up (every kind of call once, so
pools, templates and the library cache are in place) the script counts what the server holds on the host, then
keeps `--in-flight` calls going for `--minutes`, drawn in turn from: one-shot hellos of every language, cells of
two Python sessions, a Python call using an installed library (from the cache after the first), and a
matplotlib plot. Every call's latency is kept with the minute it ended in. When the load stops it waits for
the server to settle (the pools refilled) and counts again, the sessions still open: its containers, the
processes and cgroups of its sandboxes, its file descriptors, sockets and RSS, and the host's temporary
directories of sandboxes. The report gives p50/p95 per minute, the last minute's p95 over the first's
(the target: at most 1.5), and each count before and after. A failed call is counted and its first line kept.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
from bench import percentile
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from memory import rss, server_of
from result_files import record

from llm_sandbox_mcp.backends._owner import PID
from llm_sandbox_mcp.models import Limits

HELLOS: list[dict[str, Any]] = [
    {"language": "python", "code": "print('hello')"},
    {"language": "javascript", "code": "console.log('hello')"},
    {"language": "ruby", "code": "puts 'hello'"},
    {"language": "r", "code": "cat('hello\\n')"},
    {"language": "go", "code": 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }\n'},
    {"language": "cpp", "code": '#include <iostream>\nint main() { std::cout << "hello\\n"; }\n'},
    {
        "language": "java",
        "code": 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }',
    },
]
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('hello')"
# Past the warm pools' idle window (run/pool.py, 30 s, checked every 7.5 s), so pools grown under load are back.
_SETTLE_SECONDS = 45.0


def held(server: int) -> dict[str, int]:
    """What the server holds on this host now."""
    counts: dict[str, int] = {}
    fds = Path(f"/proc/{server}/fd")
    try:
        links = [os.readlink(fd) for fd in fds.iterdir()]
    except OSError:
        links = []
    counts["server file descriptors"] = len(links)
    counts["server sockets"] = sum(link.startswith("socket:") for link in links)
    counts["server RSS MiB"] = rss(server) // 1024**2
    counts["processes of its sandboxes"] = len(_sandbox_processes(server))
    # Its sandboxes' cgroups: under a directory named for its pid (server-PID-..., docker-PID-..., podman-PID-...).
    counts["cgroups of its sandboxes (memory)"] = sum(
        1 for path in Path("/sys/fs/cgroup").glob("memory/**/llm-sandbox-mcp/*/**/") if f"-{server}-" in str(path)
    )
    counts["temporary directories of sandboxes (whole host)"] = sum(1 for _ in Path("/tmp").glob("llm-sandbox*"))
    counts["containers of this server"] = _containers(server)
    return counts


def _sandbox_processes(server: int) -> set[int]:
    """Live processes of the sandbox user that the server started (its descendants: bubblewrap, NsJail) or that
    run in a cgroup named for it (containers, whose processes the engine starts)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            cgroup = (status.parent / "cgroup").read_text()
        except OSError:
            continue
        pid = int(status.parent.name)
        parents[pid] = int(fields.get("PPid", "0").strip() or 0)
        mine = fields.get("Uid", "").split()[:1] == [str(Limits().uid)]
        if mine and not fields.get("State", "").strip().startswith("Z"):
            found.add(pid)
            if f"llm-sandbox-mcp/docker-{server}-" in cgroup or f"llm-sandbox-mcp/podman-{server}-" in cgroup:
                parents[pid] = server
    return {pid for pid in found if _descends(pid, server, parents)}


def _descends(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = parents.get(pid, 0)
    return False


def _containers(server: int) -> int:
    """Containers labelled with this server's pid, on the engine BACKEND names (0 where it has none)."""
    backend = os.environ.get("BACKEND", "")
    if backend not in ("docker", "podman"):
        return 0
    import docker

    base = None if backend == "docker" else "unix:///run/podman/podman.sock"
    client = docker.DockerClient(base_url=base) if base else docker.from_env()
    try:
        listed = client.containers.list(all=True, filters={"label": PID})
        return sum(container.labels.get(PID) == str(server) for container in listed)
    finally:
        client.close()


async def call(client: Client, arguments: dict[str, Any]) -> tuple[float, str | None]:
    started = time.perf_counter()
    result = await client.call_tool("execute_code", {"timeout": 120, **arguments})
    elapsed = (time.perf_counter() - started) * 1000
    structured: dict[str, Any] = result.structured_content or {}
    if result.is_error or structured.get("exit_code") != 0 or "hello" not in str(structured.get("stdout")):
        text = str(structured.get("stderr") or structured.get("message") or result.content)
        return elapsed, text.strip().splitlines()[0][:200] if text.strip() else "failed"
    return elapsed, None


async def soak(minutes: float, in_flight: int, library: str) -> dict[str, Any]:
    env = {"SANDBOX_FOREGROUND_LIMIT": "600", **os.environ}
    params = StdioServerParameters(command=str(Path(sys.executable).parent / "llm-sandbox-mcp"), env=env)
    report: dict[str, Any] = {"minutes": minutes, "in_flight": in_flight, "load_average_at_start": os.getloadavg()}
    async with Client(params) as client:
        (server,) = server_of(os.getpid())
        sessions: list[str] = []
        for _ in range(2):
            created = await client.call_tool("create_session", {"language": "python"})
            described: dict[str, Any] = created.structured_content or {}
            sessions.append(str(described["session_id"]))
        kinds: list[tuple[str, dict[str, Any]]] = [(f"{h['language']} hello", h) for h in HELLOS]
        kinds += [
            (f"session cell {i + 1}", {"code": "print('hello')", "session_id": s}) for i, s in enumerate(sessions)
        ]
        kinds += [("library", {"code": f"import {library}\nprint('hello')", "libraries": [library]})]
        kinds += [("plot", {"code": PLOT})]
        for _, arguments in kinds:  # warm-up: pools, templates, build caches and the library's store
            await call(client, arguments)
        await anyio.sleep(_SETTLE_SECONDS)
        before = held(server)
        by_minute: dict[int, list[float]] = defaultdict(list)
        by_kind: dict[str, list[float]] = defaultdict(list)
        failures: dict[str, int] = defaultdict(int)
        first_failure: dict[str, str] = {}
        turns = itertools.cycle(kinds)
        start = time.monotonic()
        end = start + minutes * 60

        async def worker() -> None:
            while time.monotonic() < end:
                # A session runs one cell at a time: a second one for it waits its turn, and that wait is timed.
                name, arguments = next(turns)
                elapsed, failure = await call(client, arguments)
                by_minute[int((time.monotonic() - start) // 60)].append(elapsed)
                by_kind[name].append(elapsed)
                if failure is not None:
                    failures[name] += 1
                    first_failure.setdefault(name, failure)

        async with anyio.create_task_group() as tasks:
            for _ in range(in_flight):
                tasks.start_soon(worker)
        await anyio.sleep(_SETTLE_SECONDS)
        after = held(server)  # the two sessions still open, as they were before
        for session in sessions:
            await client.call_tool("close_session", {"session_id": session})
    minutes_seen = sorted(by_minute)
    report["per_minute"] = {
        str(minute + 1): {
            "calls": len(by_minute[minute]),
            "p50_ms": round(statistics.median(by_minute[minute]), 1),
            "p95_ms": round(percentile(by_minute[minute], 0.95), 1),
        }
        for minute in minutes_seen
    }
    # The last whole minute against the first (a partial last minute says little).
    whole = [minute for minute in minutes_seen if minute < int(minutes)] or minutes_seen
    first, last = report["per_minute"][str(whole[0] + 1)], report["per_minute"][str(whole[-1] + 1)]
    report["last_minute_p95_over_first"] = round(last["p95_ms"] / first["p95_ms"], 2)
    report["per_kind"] = {
        name: {"calls": len(values), "p50_ms": round(statistics.median(values), 1)} for name, values in by_kind.items()
    }
    report["failures"] = {name: {"calls": count, "first": first_failure[name]} for name, count in failures.items()}
    report["held_before"] = before
    report["held_after"] = after
    report["load_average_at_end"] = os.getloadavg()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--library", default="six", help="a pure-Python package from the configured index")
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    report = anyio.run(soak, args.minutes, args.in_flight, args.library)
    for name in report["held_before"]:
        before, after = report["held_before"][name], report["held_after"][name]
        sys.stderr.write(f"{name}: {before} -> {after}\n")
    sys.stderr.write(f"last minute p95 / first minute p95: {report['last_minute_p95_over_first']}\n")
    record("soak", os.environ.get("BACKEND", "auto"), report, args.results, short=args.minutes < 10)


if __name__ == "__main__":
    main()
