"""Result files: every benchmark's report, with the machine it ran on and when, for docs/benchmarks.md.

Each script calls `record(...)` once it has its report; the file goes to benchmarks/measured/ (or `--results
DIR`) as `<date>-<benchmark>-<backend>.json`. `benchmarks/render.py` turns the newest ones into the page.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "measured"


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _memory_gib() -> float | None:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1)
    return None


def _operating_system() -> str:
    with contextlib.suppress(OSError, AttributeError):
        return platform.freedesktop_os_release().get("PRETTY_NAME", platform.system())
    return platform.system()


def _version_of(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        shown = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        return (shown.stdout or shown.stderr).strip().splitlines()[0] if (shown.stdout or shown.stderr) else None
    return None


def _engine_version(base_url: str | None) -> str | None:
    """The version a Docker-API engine reports (Podman answers the same call), through the Docker SDK."""
    with contextlib.suppress(Exception):
        import docker

        client = docker.DockerClient(base_url=base_url, timeout=5) if base_url else docker.from_env(timeout=5)
        try:
            return str(client.version().get("Version"))
        finally:
            client.close()
    return None


def machine() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, memory, kernel, system and the engines' versions."""
    podman = os.environ.get("PODMAN_HOST") or os.environ.get("CONTAINER_HOST") or "unix:///run/podman/podman.sock"
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "architecture": platform.machine(),
        "kernel": f"{platform.system()} {platform.release()}",
        "system": _operating_system(),
        "python": platform.python_version(),
        "engines": {
            "docker": _engine_version(os.environ.get("DOCKER_HOST")),
            "podman": _engine_version(podman) if podman.startswith(("unix://", "tcp://")) else None,
            "bwrap": (_version_of(["bwrap", "--version"]) or "").removeprefix("bubblewrap ") or None,
        },
        "load_average": [round(value, 2) for value in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def record(
    benchmark: str, backend: str, report: dict[str, Any], directory: Path | None = None, short: bool = False
) -> Path:
    """Write one result file and return its path. `short`: too few calls to stand for the server's speed (a
    smoke run); the page shows it apart and never in place of a full run's numbers."""
    now = datetime.datetime.now(datetime.timezone.utc)
    result: dict[str, Any] = {
        "benchmark": benchmark,
        "backend": backend,
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "command": shlex.join([f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
        "source": "measured",
        "short": short,
        "notes": [],
        "report": report,
    }
    folder = directory or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{now.strftime('%Y-%m-%dT%H%M%S')}-{benchmark}-{backend.replace(',', '+')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    sys.stderr.write(f"result written to {path}\n")
    return path
