"""Latency of execute_code through MCP over stdio, as a client sees it.

    python benchmarks/bench.py [--runs 30] [--warmup 3] [--interval 1.0] [--json out.json]

Starts the installed `llm-sandbox-mcp` with the current environment (so BACKEND, DOCKER_HOST etc. apply),
then times sequential calls per scenario and prints median and p95 in milliseconds. `--interval` is the pause
between calls (an agent thinks between calls; the pool refills meanwhile); the pause is not timed.
--interval 0 measures back-to-back calls, where every call waits for a sandbox to be made.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from result_files import record

SCENARIOS: dict[str, dict[str, Any]] = {
    "print(1)": {"code": "print(1)"},
    "matplotlib plot": {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"},
    # A language without a warm interpreter: one exec, then everything killed from outside, then outputs read.
    "JavaScript hello": {"code": "console.log(1)", "language": "javascript"},
}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def bench(runs: int, warmup: int, interval: float) -> dict[str, Any]:
    script = str(Path(sys.executable).parent / "llm-sandbox-mcp")
    params = StdioServerParameters(command=script, env=dict(os.environ))
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "backend": os.environ.get("BACKEND", "docker"),
        "runs": runs,
        "interval_s": interval,
        "scenarios": {},
    }
    async with Client(params) as client:
        created = await client.call_tool("create_session", {"language": "python"})
        info: dict[str, Any] = created.structured_content or {}
        scenarios: dict[str, dict[str, Any]] = {
            **SCENARIOS,
            "session print(1)": {"code": "print(1)", "session_id": info.get("session_id")},
        }
        for name, arguments in scenarios.items():
            samples: list[float] = []
            for i in range(warmup + runs):
                started = time.perf_counter()
                result = await client.call_tool("execute_code", arguments)
                elapsed = (time.perf_counter() - started) * 1000
                structured: dict[str, Any] = result.structured_content or {}
                if result.is_error or structured.get("exit_code") != 0:
                    raise SystemExit(f"{name}: call failed: {result.content}")
                if i >= warmup:
                    samples.append(elapsed)
                await anyio.sleep(interval)
            report["scenarios"][name] = {
                "p50_ms": round(statistics.median(samples), 1),
                "p95_ms": round(percentile(samples, 0.95), 1),
                "min_ms": round(min(samples), 1),
            }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between calls (not timed)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    report = anyio.run(bench, args.runs, args.warmup, args.interval)
    lines = [f"{report['machine']} · backend {report['backend']} · {report['runs']} runs, {args.interval:g} s apart"]
    for name, numbers in report["scenarios"].items():
        lines.append(f"  {name:<18} p50 {numbers['p50_ms']:>7.1f} ms   p95 {numbers['p95_ms']:>7.1f} ms")
    sys.stdout.write("\n".join(lines) + "\n")
    record("bench", report["backend"], report, args.results, short=args.runs < 10)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
