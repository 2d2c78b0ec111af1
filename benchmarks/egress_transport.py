"""How fast a sandbox reaches the egress proxy through the tunnel over its own stream (egress/__init__.py).

    python benchmarks/egress_transport.py [--engines docker,podman,bubblewrap] [--runs 5] [--mib 64]
        [--packages sympy==1.13.3] [--what throughput,install] [--json F]

On each engine, medians over `--runs`:
- throughput: a session given a host on this machine downloads a `--mib` MiB blob from it through the proxy
  (timed inside the sandbox, so only the path sandbox -> relay -> tunnel -> proxy -> server counts);
- install: a library install of `--packages` (real packages from the public registry, about 7 MB of
  wheels), its store dropped after each run so each run downloads and installs again.

Measured on this project's machine (2 cores, shared with other test runs, so spread is wide), against the
socket mount that the tunnel replaced (this script's first version, run at commit 507d335, forced the transport
through the backends' old `egress_transport` attribute); throughput medians of 5 runs, two rounds; installs
medians of 3:

    engine       throughput socket   throughput tunnel   install socket   install tunnel
    docker       316-450 MiB/s       61-95 MiB/s         8.6 s            11.0 s
    bubblewrap   361-673 MiB/s       63-104 MiB/s        8.5 s            8.3 s
    podman       326-344 MiB/s       48-73 MiB/s         7.9 s            7.2 s

The tunnel costs raw speed (every byte crosses the engine's exec stream and a worker thread), but stays above
what a registry download reaches, and an install takes about as long either way.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import record

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from tests.engines.conftest import engine_settings
from tests.support.egress import loopback_name
from tests.support.registries import serve

DOWNLOAD = """
import time, urllib.request
start = time.perf_counter()
with urllib.request.urlopen({url!r}, timeout=300) as answer:
    size = 0
    while chunk := answer.read(1 << 20):
        size += len(chunk)
print(size, time.perf_counter() - start)
"""


def _median(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


async def throughput(engine: str, base: str, runs: int) -> dict[str, Any]:
    host = base.removeprefix("http://")
    settings = engine_settings(engine, sandbox_install_network_mode=None, sandbox_session_allow_hosts=[host])
    backend = load_backend(engine, settings)
    rates: list[float] = []
    try:
        async with Executor(settings, backend) as executor:
            sessions = SessionRegistry(settings, executor)
            try:
                session = await sessions.create("python", [], network=[host])
                for _ in range(runs):
                    result = await sessions.execute(session.id, DOWNLOAD.format(url=f"{base}/blob"), [], 300)
                    if result.exit_code != 0:
                        raise RuntimeError(f"download failed on {engine}: {result.stderr[-2000:]}")
                    size, seconds = result.stdout.split()
                    rates.append(int(size) / 1024**2 / float(seconds))
            finally:
                await sessions.aclose()
    finally:
        await backend.aclose()
    return {"median_mib_s": _median(rates), "min_mib_s": round(min(rates), 2)}


async def installs(engine: str, packages: list[str], runs: int) -> dict[str, Any]:
    settings = engine_settings(engine, sandbox_install_network_mode=None)
    backend = load_backend(engine, settings)
    samples: list[float] = []
    try:
        async with Executor(settings, backend) as executor:
            for _ in range(runs):
                start = time.perf_counter()
                key = await executor.libraries.ensure(get_language("python"), packages)
                samples.append(time.perf_counter() - start)
                await backend.drop_cache(key)
                executor.libraries._ready.pop(key, None)  # pyright: ignore[reportPrivateUsage]
    finally:
        await backend.aclose()
    return {"median_s": _median(samples), "max_s": round(max(samples), 2)}


async def main(engines: list[str], runs: int, mib: int, packages: list[str], what: list[str]) -> dict[str, Any]:
    name, address = loopback_name()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-egress-transport-") as tmp:
        (Path(tmp) / "blob").write_bytes(secrets.token_bytes(mib * 1024**2))
        with serve(Path(tmp), address, name) as base:
            for engine in engines:
                found: dict[str, Any] = {}
                if "throughput" in what:
                    found["throughput"] = await throughput(engine, base, runs)
                if "install" in what:
                    found["install"] = await installs(engine, packages, runs)
                report[engine] = found
                sys.stderr.write(f"{engine}: {found}\n")
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="docker,podman,bubblewrap")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--packages", default="sympy==1.13.3")
    parser.add_argument("--what", default="throughput,install")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    result = anyio.run(
        main,
        args.engines.split(","),
        args.runs,
        args.mib,
        args.packages.split(","),
        args.what.split(","),
    )
    text = json.dumps(result, indent=2)
    sys.stdout.write(text + "\n")
    record("egress_transport", args.engines, result, args.results)
    if args.json:
        args.json.write_text(text + "\n")
