"""The first answer on an engine that has the base image but no project image: seconds from spawning the
server to the result of its first `print(1)`, and whether that was a result or a background job.

    BACKEND=docker python benchmarks/first_call.py [--runs 5] [--json out.json]

Drives the installed `llm-sandbox-mcp` (beside this Python) over stdio with the official client, as a user's
client would, with the server's default foreground limit. Each run gets a base image of its own: the Python
stand-in base with one label added (a new image id, so neither the project image nor any build cache of it
is on the engine, as on a user's engine that holds only the official image) and a cache directory of its
own (no build lock or log of an earlier run). The project image's real build (the registry's wheels) starts
in the background as it would for a user, and competes with the first call; the run ends it afterwards and
removes everything it made: the build process, the images built on its base, the base itself.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from result_files import record

from llm_sandbox_mcp.config import Settings

TARGET_S = 10.0


def _engine(backend: str) -> Any:
    if backend == "podman":
        from podman import PodmanClient

        return PodmanClient(base_url="unix:///run/podman/podman.sock")
    import docker

    return docker.from_env()


def _fresh_base(client: Any, backend: str, source: str) -> str:
    """The source image under a new name and a new id (one label more), nothing built on it yet."""
    name = f"localhost/firstcall-bench/python:{secrets.token_hex(4)}"
    dockerfile = f"FROM {source}\nLABEL org.llm-sandbox-mcp.bench={name}\n"
    # Podman's SDK copies the Dockerfile as text, Docker's sends bytes.
    fileobj = io.StringIO(dockerfile) if backend == "podman" else io.BytesIO(dockerfile.encode())
    client.images.build(fileobj=fileobj, tag=name, rm=True)
    return name


def _builds_of(cache_home: str) -> list[int]:
    """The `images build` processes a run's server started (they carry its XDG_CACHE_HOME)."""
    marker = f"XDG_CACHE_HOME={cache_home}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _end_builds(cache_home: str) -> tuple[int, str | None]:
    """Kill the run's build processes; how many there were and the last line of the build's log."""
    builds = _builds_of(cache_home)
    for pid in builds:
        os.kill(pid, signal.SIGKILL)
    logs = list(Path(cache_home).glob("llm-sandbox-mcp/images/*.log"))
    lines = logs[0].read_text(errors="replace").splitlines() if logs else []
    return len(builds), (lines[-1][:120] if lines else None)


def _remove_built_on(client: Any, base: str) -> None:
    """Every image made on `base` (project image, build steps of an interrupted build), then `base`."""
    base_id = client.images.get(base).id
    images = client.images.list(all=True)
    children = {image.id: image.attrs.get("Parent") or image.attrs.get("ParentId") for image in images}
    doomed = {base_id}
    while True:
        more = {child for child, parent in children.items() if parent in doomed and child not in doomed}
        if not more:
            break
        doomed |= more
    by_depth = sorted(doomed - {base_id}, key=lambda image: -_depth(image, children))
    for image in by_depth:
        try:
            client.images.remove(image, force=True)
        except Exception as exc:  # one left behind is reported, not fatal; one gone with its child is fine
            if "No such image" not in str(exc) and "image not known" not in str(exc):
                sys.stderr.write(f"could not remove {image[:19]}: {exc}\n")
    client.images.remove(base, force=True)


def _depth(image: str, parents: dict[str, Any]) -> int:
    depth = 0
    while parents.get(image):
        image, depth = parents[image], depth + 1
    return depth


async def one_run(backend: str, base: str, cache_home: str) -> dict[str, Any]:
    env = {**os.environ, "BACKEND": backend, "SANDBOX_IMAGE_PYTHON": base, "XDG_CACHE_HOME": cache_home}
    # Engines without a bridge network (this project's machines) give builds the host's network.
    env.setdefault("SANDBOX_IMAGE_BUILD_NETWORK", "host")
    command = str(Path(sys.executable).parent / "llm-sandbox-mcp")
    started = time.perf_counter()
    async with Client(StdioServerParameters(command=command, env=env)) as client:
        result = await client.call_tool("execute_code", {"code": "print(1)"})
        elapsed = time.perf_counter() - started
    structured: dict[str, Any] = result.structured_content or {}
    return {
        "seconds": round(elapsed, 2),
        "status": structured.get("status"),
        "stdout": structured.get("stdout"),
        "is_error": result.is_error,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    backend = os.environ.get("BACKEND", "docker")
    client = _engine(backend)
    source = Settings().base_image_for("python")
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for number in range(args.runs):
        base = _fresh_base(client, backend, source)
        with tempfile.TemporaryDirectory(prefix="first-call-") as cache_home:
            try:
                run = await one_run(backend, base, cache_home)
            finally:
                builds, tail = _end_builds(cache_home)
                await anyio.sleep(2)  # the engine cancels the build once its connection closes
                _remove_built_on(client, base)
        run["load_1m"] = round(os.getloadavg()[0], 2)
        run["build_processes_ended"] = builds
        run["build_log_last_line"] = tail
        runs.append(run)
        sys.stderr.write(f"run {number + 1}: {json.dumps(run)}\n")
    client.close()
    seconds = [run["seconds"] for run in runs]
    report = {
        "backend": backend,
        "base": source,
        "runs": runs,
        "median_s": round(statistics.median(seconds), 2),
        "max_s": max(seconds),
        "all_results_not_jobs": all(run["status"] == "finished" and run["stdout"] == "1\n" for run in runs),
        "target_s": TARGET_S,
        "load_before": [round(value, 2) for value in load_before],
        "load_after": [round(value, 2) for value in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    text = json.dumps(report, indent=1)
    record("first_call", backend, report, args.results)
    if args.json:
        args.json.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    anyio.run(main)
