"""Where a call's time goes: back-to-back `print(1)` on each engine, stage by stage, beside its floors.

    python benchmarks/stages.py [--engines bubblewrap,docker,podman,nsjail] [--runs 30] [--warmup 5]

For each engine, one server with SANDBOX_TRACE_STAGES=true (its stderr goes to a file this script reads): the
server logs each request's account, from the request reaching its code (the SDK has read and parsed the
JSON-RPC message) to the answer being ready for the wire. Beside each call's time as the client sees it, the
table shows every stage's mean (means add up: the stages and "outside the server's account" sum to the mean
call), the floors measured in the same run on the same server (`tools/list` and a tool that does nothing,
`list_sessions`, whose own account says what the SDK costs), and the machine's floors (a fork of a warm
interpreter; a fresh bwrap + python3 -S). "Outside the server's account" is the client, the pipes, reading and
parsing the request and writing the answer: the same work as in the floors' round trips.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import anyio
import cpu_time
from mcp import Client
from mcp.client.stdio import stdio_client
from render import _table as render_table  # pyright: ignore[reportPrivateUsage]
from render import stages_rows
from result_files import record
from table import HELLO, floor, percentile, server

ACCOUNT = re.compile(r"llm_sandbox_mcp\.stages: stages (\{.*\})\s*$")
OUTSIDE = "outside the server's account (client, stdio, JSON-RPC in and out)"


def parse_accounts(text: str) -> list[dict[str, Any]]:
    """Every request's account in the server's stderr, in the order they were logged; other lines (and a line
    cut short, say by a server that was stopped) are skipped."""
    accounts: list[dict[str, Any]] = []
    for line in text.splitlines():
        found = ACCOUNT.search(line)
        if found is None:
            continue
        try:
            account = json.loads(found.group(1))
        except ValueError:
            continue
        if isinstance(account, dict) and isinstance(account.get("stages"), list):  # pyright: ignore[reportUnknownMemberType]
            accounts.append(cast("dict[str, Any]", account))
    return accounts


def _dict(value: object) -> dict[str, Any]:
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}


def owners(walls: list[float], accounts: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean milliseconds per stage (in the order the stages came), what is outside the server's account, and
    the calls' spread; `walls[i]` is the client's time of the call `accounts[i]` accounts for."""
    if len(walls) != len(accounts) or not walls:
        raise ValueError(f"{len(walls)} calls timed but {len(accounts)} accounts logged")
    each: dict[str, list[float]] = {}
    for account in accounts:
        for stage in account["stages"]:
            each.setdefault(str(stage["stage"]), []).append(float(stage["ms"]))
    count = len(accounts)
    # A stage a call did not go through took it no time (the list is padded for the median).
    stages = {name: round(sum(values) / count, 2) for name, values in each.items()}
    medians = {
        name: round(statistics.median(values + [0.0] * (count - len(values))), 2) for name, values in each.items()
    }
    inside = statistics.fmean(float(account["total_ms"]) for account in accounts)
    sources = Counter(
        " / ".join(str(v) for v in _dict(account.get("notes")).values()) or "no note" for account in accounts
    )
    return {
        "calls": count,
        "p50_ms": round(statistics.median(walls), 1),
        "p95_ms": round(percentile(walls, 0.95), 1),
        "mean_ms": round(statistics.fmean(walls), 2),
        "server_mean_ms": round(inside, 2),
        "stages_mean_ms": {OUTSIDE: round(statistics.fmean(walls) - inside, 2), **stages},
        "stages_p50_ms": medians,
        "sandboxes": dict(sources),
    }


async def _timed(action: Any) -> float:
    started = time.perf_counter()
    await action()
    return (time.perf_counter() - started) * 1000


async def engine(name: str, runs: int, warmup: int) -> dict[str, Any]:
    """One server on `name`: back-to-back print(1) and the two MCP floors, each with the server's accounts."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as errlog:
        params = server({"BACKEND": name, "SANDBOX_TRACE_STAGES": "true"})
        async with Client(stdio_client(params, errlog=errlog)) as client:
            arguments = {"timeout": 120, **HELLO["python print(1)"]}

            async def call() -> None:
                result = await client.call_tool("execute_code", arguments)
                if result.is_error or _dict(result.structured_content).get("exit_code") != 0:
                    raise SystemExit(f"{name}: print(1) failed: {result.content}")

            async def nothing() -> None:
                await client.call_tool("list_sessions", {})

            for _ in range(warmup):
                await call()
            await anyio.sleep(2.0)  # the pool and the zygote ready before the first measured call
            calls = [await _timed(call) for _ in range(runs)]
            listings = [await _timed(client.list_tools) for _ in range(runs)]
            idle = [await _timed(nothing) for _ in range(runs)]
            cpu = await cpu_per_call(runs, call, nothing)
        errlog.seek(0)
        accounts = parse_accounts(errlog.read())
    executed = [a for a in accounts if a.get("tool") == "execute_code"][warmup : warmup + runs]
    listed = [a for a in accounts if a.get("tool") == "list_sessions"][:runs]
    return {
        "print(1) back to back": owners(calls, executed),
        "floor: tools/list round trip": {"p50_ms": round(statistics.median(listings), 2)},
        "floor: list_sessions (a tool that does nothing)": owners(idle, listed),
        "cpu_per_call_ms": cpu,
    }


async def cpu_per_call(runs: int, call: Any, nothing: Any) -> dict[str, Any]:
    """CPU per back-to-back print(1) and per call of the tool that does nothing, by whose it is (cpu_time.py),
    each over a series of its own after the timed ones."""
    pid = cpu_time.child_named("llm-sandbox-mcp")
    if pid is None:
        return {}
    found: dict[str, Any] = {}
    for name, action in (("print(1)", call), ("a tool that does nothing", nothing)):

        async def series(action: Any = action) -> None:
            for _ in range(runs):
                await action()

        found[name] = (await cpu_time.account(pid, runs, series)).as_dict(os.cpu_count() or 1)
    return found


async def measure(engines: list[str], runs: int, warmup: int) -> dict[str, Any]:
    report: dict[str, Any] = {"runs": runs, "load_average_at_start": os.getloadavg(), "engines": {}}
    for name in engines:
        try:
            report["engines"][name] = await engine(name, runs, warmup)
        except (SystemExit, Exception) as exc:  # one engine failing leaves the others measured
            report["engines"][name] = {"failed": str(exc)[:300]}
    report["floor_ms"] = floor(runs)
    report["load_average_at_end"] = os.getloadavg()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="bubblewrap,docker,podman,nsjail")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    report = anyio.run(measure, engines, args.runs, args.warmup)
    header, table = stages_rows(report)
    lines = render_table(header, table)
    lines.append("floor on this machine: " + "; ".join(f"{k} {v} ms" for k, v in report["floor_ms"].items()))
    sys.stdout.write("\n".join(lines) + "\n")
    record("stages", "+".join(engines), report, args.results, short=args.runs < 10)


if __name__ == "__main__":
    main()
