"""What serving over HTTP costs: the same engine and settings behind stdio and behind `serve --http` on loopback.

    BACKEND=bubblewrap python benchmarks/http_vs_stdio.py [--runs 30] [--warmup 5] [--rounds 3]

(Not `benchmarks/http.py`: a script's own folder comes first on `sys.path`, and a file named `http.py` there
would hide the standard library's `http` package from everything the script imports.)

Two servers run side by side, the installed `llm-sandbox-mcp` over stdio and `llm-sandbox-mcp serve --http
127.0.0.1:PORT` with a tokens file of four principals, with the same environment (BACKEND, default
bubblewrap). The official client drives both: the HTTP one through the SDK's streamable-HTTP client, with a
token. Measured, alternating one call on each server so both see the same load:
- `print(1)` back to back, p50 / p95;
- the floor: the MCP round trip of a tool that does nothing (`get_supported_languages`), p50 / p95;
- the latency HTTP adds: the difference of the medians;
- calls per second, 16 `print(1)` calls with 8 in flight, on each server (median of `--rounds`);
- the same 16 calls with 8 in flight from four principals at once over HTTP (each its own token and client:
  4 calls, 2 in flight each).
SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL is 8 on the HTTP server so that one principal may have 8 calls in flight.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from render import _table as render_table  # pyright: ignore[reportPrivateUsage]
from render import http_rows
from result_files import record
from table import HELLO, SHORT_RUNS, floor, server, summary

PRINCIPALS = ("ana", "ben", "cai", "dee")
# The same for both servers; the HTTP ones mean nothing to the stdio server.
SETTINGS = {
    "BACKEND": os.environ.get("BACKEND", "bubblewrap"),
    "SANDBOX_FOREGROUND_LIMIT": "600",
    "SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL": "8",
}
PRINT_1 = {"timeout": 120, **HELLO["python print(1)"]}
Call = Callable[[Client], Awaitable[None]]


async def print_1(client: Client) -> None:
    result = await client.call_tool("execute_code", PRINT_1)
    structured: dict[str, Any] = result.structured_content or {}
    if result.is_error or structured.get("exit_code") != 0 or structured.get("stdout") != "1\n":
        raise SystemExit(f"print(1) failed: {result.content}")


async def nothing(client: Client) -> None:
    result = await client.call_tool("get_supported_languages", {})
    if result.is_error:
        raise SystemExit(f"get_supported_languages failed: {result.content}")


async def _timed(call: Call, client: Client) -> float:
    started = time.perf_counter()
    await call(client)
    return (time.perf_counter() - started) * 1000


async def alternating(call: Call, stdio: Client, http: Client, runs: int) -> dict[str, list[float]]:
    """`runs` calls on each, one on stdio then one over HTTP, so a change of the machine's load hits both."""
    found: dict[str, list[float]] = {"stdio": [], "http": []}
    for _ in range(runs):
        found["stdio"].append(await _timed(call, stdio))
        found["http"].append(await _timed(call, http))
    return found


async def throughput(clients: list[Client], calls: int, in_flight: int) -> float:
    """`calls` print(1) calls shared out evenly among `clients`, each with its share of `in_flight`."""
    each_calls, each_in_flight = calls // len(clients), max(1, in_flight // len(clients))

    async def one_client(client: Client) -> None:
        limiter = anyio.CapacityLimiter(each_in_flight)

        async def one() -> None:
            async with limiter:
                await print_1(client)

        async with anyio.create_task_group() as tasks:
            for _ in range(each_calls):
                tasks.start_soon(one)

    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for client in clients:
            tasks.start_soon(one_client, client)
    return calls / (time.perf_counter() - started)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def http_server(folder: Path) -> AsyncGenerator[tuple[str, dict[str, str]]]:
    """`serve --http` on a free loopback port with one token per principal: its URL and the tokens, once
    /readyz says the engine answers."""
    tokens = {principal: secrets.token_hex(32) for principal in PRINCIPALS}
    tokens_file = folder / "tokens"
    tokens_file.write_text("".join(f"{principal} {token}\n" for principal, token in tokens.items()))
    tokens_file.chmod(0o600)
    port = _free_port()
    params = server(SETTINGS)
    env = {**(params.env or {}), "SANDBOX_HTTP_TOKENS_FILE": str(tokens_file)}
    log = folder / "http-server.log"
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as err:
        process = await anyio.open_process(
            [params.command, "serve", "--http", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    probe = httpx2.AsyncClient()
    try:
        async with probe:
            with anyio.fail_after(120):
                while True:
                    if process.returncode is not None:
                        raise SystemExit(f"serve --http exited: {log.read_text()[-2000:]}")
                    try:
                        if (await probe.get(f"{base}/readyz")).status_code == 200:
                            break
                    except httpx2.TransportError:
                        pass
                    await anyio.sleep(0.2)
        yield f"{base}/mcp", tokens
    finally:
        process.terminate()
        with anyio.move_on_after(60, shield=True) as waiting:
            await process.wait()
        if waiting.cancelled_caught:
            process.kill()


@asynccontextmanager
async def http_client(url: str, token: str) -> AsyncGenerator[Client]:
    # The transport leaves a client it is given open: closed here.
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        yield client


async def measure(runs: int, warmup: int, rounds: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "backend": SETTINGS["BACKEND"],
        "runs": runs,
        "settings": dict(SETTINGS),
        "load_average_at_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-http-bench-") as folder:
        async with (
            http_server(Path(folder)) as (url, tokens),
            Client(server(SETTINGS)) as stdio,
            http_client(url, tokens[PRINCIPALS[0]]) as http,
            http_client(url, tokens[PRINCIPALS[1]]) as second,
            http_client(url, tokens[PRINCIPALS[2]]) as third,
            http_client(url, tokens[PRINCIPALS[3]]) as fourth,
        ):
            for client in (stdio, http, second, third, fourth):
                for _ in range(warmup):
                    await print_1(client)
            await anyio.sleep(2.0)  # the pools and templates ready before the first measured call
            floors = await alternating(nothing, stdio, http, runs)
            calls = await alternating(print_1, stdio, http, runs)
            rates: dict[str, list[float]] = {"stdio": [], "http": [], "http, 4 principals": []}
            for _ in range(rounds):
                rates["stdio"].append(await throughput([stdio], 16, 8))
                rates["http"].append(await throughput([http], 16, 8))
                rates["http, 4 principals"].append(await throughput([http, second, third, fourth], 16, 8))
    report["scenarios"] = {
        "print(1) back to back": {transport: summary(samples) for transport, samples in calls.items()},
        "floor: get_supported_languages (a tool that does nothing)": {
            transport: summary(samples) for transport, samples in floors.items()
        },
    }
    report["added_by_http_p50_ms"] = {
        name: round(numbers["http"]["p50_ms"] - numbers["stdio"]["p50_ms"], 1)
        for name, numbers in report["scenarios"].items()
    }
    report["calls_per_s_16_calls_8_in_flight"] = {
        transport: round(statistics.median(samples), 1) for transport, samples in rates.items()
    }
    report["rounds"] = rounds
    report["floor_ms"] = floor(runs)
    report["load_average_at_end"] = os.getloadavg()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="throughput measurements per row (the median)")
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    report = anyio.run(measure, args.runs, args.warmup, args.rounds)
    header, rows = http_rows(report)
    lines = render_table(header, rows)
    lines.append("floor on this machine: " + "; ".join(f"{k} {v} ms" for k, v in report["floor_ms"].items()))
    sys.stdout.write("\n".join(lines) + "\n")
    record("http", report["backend"], report, args.results, short=args.runs < SHORT_RUNS)


if __name__ == "__main__":
    main()
