"""The speed smoke that CI runs: a 3x regression fails it, measured as ratios to floors of the same run.

    python benchmarks/smoke.py [--command PATH] [--engine bubblewrap --engine docker] [--runs 15]

Per engine, a server is started over stdio with the official client, `print(1)` is called back to back, and its
median is divided by the median of a fork of a warm interpreter, measured beside it; start-up (spawn to
`tools/list`) is divided by the same interpreter importing the MCP SDK. Each ratio is compared with the one
in the newest full result of benchmarks/table.py for that engine (benchmarks/measured/): more than three times
that ratio fails. Ratios, not times, so a machine three times slower passes and a server three times slower
than its floor allows does not. The report goes to stderr and, with --json, to a file; nothing is recorded in
benchmarks/measured (a smoke is too short to stand for the server's speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

RESULTS = Path(__file__).resolve().parent / "measured"
ALLOWED = 3.0
FORK = "fork of a warm interpreter"
IMPORT = "import mcp.server (the official SDK)"


@dataclass(frozen=True)
class Baseline:
    """The ratios of a full run, and the file they came from."""

    call: float  # back-to-back print(1) p50 / fork of a warm interpreter
    start: float  # spawn to tools/list / importing the SDK
    source: str


def baseline(engine: str, results: Path = RESULTS) -> Baseline:
    """The newest full (not short) table results for `engine` that hold each ratio; the default server's
    print(1) is the zygote's where the run measured both."""
    call: tuple[float, str] | None = None
    start: tuple[float, str] | None = None
    for path in sorted(results.glob(f"*-table-{engine}*.json"), reverse=True):
        result = json.loads(path.read_text())
        if result.get("short") or result.get("backend") != engine:
            continue
        report: dict[str, Any] = result["report"]
        fork = _number(report, "floor_ms", FORK)
        python: dict[str, Any] = (report.get("zygote") or report).get("scenarios", {}).get("python print(1)") or {}
        back_to_back = _number(python, "back_to_back", "p50_ms")
        if call is None and fork and back_to_back:
            call = (back_to_back / fork, path.name)
        floor = _number(report, "start_floor_ms", IMPORT)
        listed = report.get("start_to_tools_list_ms")
        if start is None and floor and isinstance(listed, (int, float)):
            start = (float(listed) / floor, path.name)
    if call is None or start is None:
        raise SystemExit(f"no full table result for {engine} in {results} holds both ratios: run benchmarks/table.py")
    return Baseline(call[0], start[0], f"{call[1]}, {start[1]}")


def _number(report: dict[str, Any], section: str, key: str) -> float | None:
    part: dict[str, Any] = report.get(section) or {}
    found: object = part.get(key)
    return float(found) if isinstance(found, (int, float)) and found > 0 else None


def verdict(engine: str, measured_call: float, measured_start: float, base: Baseline) -> list[str]:
    """The regressions, one line each; none when both ratios are within ALLOWED times the baseline's."""
    failures: list[str] = []
    for what, measured, known in (
        ("back-to-back print(1) / fork of a warm interpreter", measured_call, base.call),
        ("start-up to tools/list / importing the MCP SDK", measured_start, base.start),
    ):
        if measured > ALLOWED * known:
            failures.append(
                f"{engine}: {what} is {measured:.1f}, more than {ALLOWED:g}x the {known:.1f} of {base.source}"
            )
    return failures


def fork_ms(runs: int) -> float:
    samples: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def import_ms(runs: int, env: dict[str, str]) -> float:
    import subprocess

    samples: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        code = "import mcp.server, sys; sys.stdout.write('ready\\n'); sys.stdout.flush()"
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
        assert child.stdout is not None
        child.stdout.readline()
        samples.append((time.perf_counter() - started) * 1000)
        child.wait()
        child.stdout.close()
    return statistics.median(samples)


async def measure(command: str, engine: str, runs: int) -> dict[str, float]:
    env = {**os.environ, "BACKEND": engine, "SANDBOX_FOREGROUND_LIMIT": "600"}
    params = StdioServerParameters(command=command, env=env)
    started = time.perf_counter()
    async with Client(params) as client:
        await client.list_tools()
        listed = (time.perf_counter() - started) * 1000
        samples: list[float] = []
        for index in range(3 + runs):  # the first calls wait for the template and its children
            began = time.perf_counter()
            result = await client.call_tool("execute_code", {"code": "print(1)", "timeout": 60})
            elapsed = (time.perf_counter() - began) * 1000
            structured: dict[str, Any] = result.structured_content or {}
            if result.is_error or structured.get("stdout") != "1\n":
                raise SystemExit(f"{engine}: print(1) failed: {result.content}")
            if index >= 3:
                samples.append(elapsed)
    return {
        "print_p50_ms": round(statistics.median(samples), 1),
        "fork_ms": round(fork_ms(runs * 4), 2),
        "start_ms": round(listed, 1),
        "import_ms": round(import_ms(3, env), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", default=str(Path(sys.executable).parent / "llm-sandbox-mcp"))
    parser.add_argument("--engine", action="append", default=[])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    failures: list[str] = []
    report: dict[str, Any] = {"load_average_at_start": os.getloadavg(), "engines": {}}
    for engine in args.engine or ["bubblewrap", "docker"]:
        base = baseline(engine)
        measured = anyio.run(measure, args.command, engine, args.runs)
        call, start = measured["print_p50_ms"] / measured["fork_ms"], measured["start_ms"] / measured["import_ms"]
        report["engines"][engine] = {**measured, "call_ratio": round(call, 1), "start_ratio": round(start, 2)}
        report["engines"][engine]["baseline"] = {"call_ratio": round(base.call, 1), "start_ratio": round(base.start, 2)}
        failures += verdict(engine, call, start, base)
        sys.stderr.write(
            f"smoke {engine}: print(1) {measured['print_p50_ms']} ms = {call:.1f}x a fork ({base.call:.1f}x in "
            f"{base.source}); start {measured['start_ms']} ms = {start:.2f}x the SDK import ({base.start:.2f}x)\n"
        )
    report["load_average_at_end"] = os.getloadavg()
    report["failures"] = failures
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    for line in failures:
        sys.stderr.write(f"REGRESSION {line}\n")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
