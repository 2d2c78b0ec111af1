"""What the egress proxy costs: per connection, and per library install, against the installer's host network.

    python benchmarks/egress.py [--engines docker,bubblewrap,kubernetes] [--runs 5] [--connections 200] [--json F]

Everything stays on this machine: a local pip index on 127.0.0.1 (tests/support/registries) serves one small
wheel under a new version per run, so every install really downloads and installs. An install "with" the
proxy is the default configuration; "without" is SANDBOX_INSTALL_NETWORK_MODE=host (the old default on
bubblewrap, and what engines without a bridge need otherwise). Kubernetes is the test double
(tests/support/k8s_double), its pods Docker containers: the proxy goes through its exec tunnel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_files import record

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.egress.proxy import open_listener
from llm_sandbox_mcp.host_rules import HostRule
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.run.executor import Executor
from tests.engines import kube
from tests.engines.conftest import engine_settings
from tests.support.registries import pip_index, serve


def _summary(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(max(samples), 2)}


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
    writer.write(head)
    await writer.drain()
    await reader.read()
    writer.close()


async def _get_through(stream: SocketStream, head: bytes) -> None:
    async with stream:
        await stream.send(head)
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while await stream.receive():
                pass


async def connections(url: str, count: int) -> dict[str, Any]:
    """A plain-HTTP GET of a small page, directly and through the proxy (a new connection each, handed to it as
    the tunnel does)."""
    host, port = url.removeprefix("http://").split(":")
    listener = open_listener(EgressPolicy.of([HostRule.parse(f"{host}:{port}", explicit=True)], "-"), "bench")
    direct_head = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    proxied_head = f"GET {url}/ HTTP/1.1\r\n\r\n".encode()
    timings: dict[str, list[float]] = {"direct": [], "proxy": []}
    try:
        for _ in range(count):
            start = time.perf_counter()
            await _get(*await asyncio.open_connection(host, int(port)), direct_head)
            timings["direct"].append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            await _get_through(await listener.connect(), proxied_head)
            timings["proxy"].append((time.perf_counter() - start) * 1000)
    finally:
        await listener.aclose()
    return {name: _summary(samples) for name, samples in timings.items()}


async def installs(engine: str, root: Path, index: str, runs: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for label, network in (("proxy", None), ("host network", "host")):
        # The engine as the tests reach it (the Kubernetes double included), configured only as this benchmark says.
        settings = engine_settings(
            engine, sandbox_install_network_mode=network, sandbox_pip_index_url=index, sandbox_install_ca_bundle=None
        )
        backend = load_backend(engine, settings)
        samples: list[float] = []
        try:
            async with Executor(settings, backend) as executor:
                for _ in range(runs):
                    # A new version each run, so each install downloads: the index page names only it.
                    token = str(secrets.randbelow(10**9))
                    spec = pip_index(root / token, token).spec
                    page = (root / token / "simple" / "greet-egress" / "index.html").read_text()
                    (root / "simple" / "greet-egress" / "index.html").write_text(
                        page.replace("../../files", f"../../{token}/files")
                    )
                    start = time.perf_counter()
                    key = await executor.libraries.ensure(get_language("python"), [spec])
                    samples.append((time.perf_counter() - start) * 1000)
                    await backend.drop_cache(key)
        finally:
            await backend.aclose()
        report[label] = _summary(samples)
    return report


async def main(engines: list[str], runs: int, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-egress-bench-") as tmp:
        root = Path(tmp)
        with serve(root) as url:
            (root / "simple" / "greet-egress").mkdir(parents=True)
            report: dict[str, Any] = {"connection": await connections(url, count), "install": {}}
            for engine in engines:
                report["install"][engine] = await installs(engine, root, f"{url}/simple", runs)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="docker,bubblewrap")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    try:
        result = anyio.run(main, args.engines.split(","), args.runs, args.connections)
    finally:
        kube.stop()
    text = json.dumps(result, indent=2)
    sys.stdout.write(text + "\n")
    record("egress", args.engines, result, args.results)
    if args.json:
        args.json.write_text(text + "\n")
