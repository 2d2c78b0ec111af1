"""The speed table: every language paced and back to back, parallel throughput, start and stop, and the
physical floor of this machine measured in the same run.

    BACKEND=docker python benchmarks/table.py [--runs 10] [--warmup 2] [--json out.json] [--only go --only cpp]
                                              [--zygote] [--start-stop]

Drives the installed `llm-sandbox-mcp` (beside this Python) over stdio with the official client, as a user's
client would. Paced calls are one second apart (an agent thinking; the pool refills meanwhile); back-to-back
calls follow each other at once; "16 calls, 8 in flight" is what parallel tool calls and sub-agents do.
The floor is what the engine costs with no server at all: a process in a fresh bubblewrap sandbox, an exec
into a running container, and a fork of a warm interpreter. `--zygote` measures the Python rows and the
throughput once more on a second server with SANDBOX_ZYGOTE=true, beside the first, which then runs with
SANDBOX_ZYGOTE=false (bubblewrap: a template's children; Docker and Podman: template containers' children).
Start-up is measured beside its own floor: the same interpreter, in the server's environment, starting and
importing the MCP SDK (whether that reads compiled bytecode is part of the report); shutdown right after
tools/list and with a warm pool. `--start-stop` measures only those rows and the floors.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import anyio
import cpu_time
import mcp
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from result_files import record

HELLO: dict[str, dict[str, Any]] = {
    "python print(1)": {"code": "print(1)"},
    "python matplotlib plot": {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"},
    "javascript hello": {"language": "javascript", "code": "console.log('hello')"},
    "ruby hello": {"language": "ruby", "code": "puts 'hello'"},
    "r hello": {"language": "r", "code": "cat('hello\\n')"},
    "java hello": {
        "language": "java",
        "code": 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }',
    },
    "go hello": {"language": "go", "code": 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }\n'},
    "cpp hello": {"language": "cpp", "code": '#include <iostream>\nint main() { std::cout << "hello\\n"; }\n'},
}
# Compiled hellos are measured twice: built on every call (each call's source ends in its own comment, so the
# server's build cache never has it) and already built (the same source again: the cache runs it unbuilt).
for _language in ("go", "cpp"):
    HELLO[f"{_language} hello, already built"] = HELLO[f"{_language} hello"]
BUILT_EACH_CALL = {"go hello", "cpp hello"}
# Fewer calls per column than this make a short run: shown apart on docs/benchmarks.md, never as the numbers.
SHORT_RUNS = 10


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(samples), 1), "p95_ms": round(percentile(samples, 0.95), 1)}


def server(extra: dict[str, str] | None = None) -> StdioServerParameters:
    # A slow build on a loaded machine stays one call rather than turning into a background job.
    env = {"SANDBOX_FOREGROUND_LIMIT": "600", **os.environ, **(extra or {})}
    return StdioServerParameters(command=str(Path(sys.executable).parent / "llm-sandbox-mcp"), env=env)


async def timed_call(client: Client, arguments: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = await client.call_tool("execute_code", {"timeout": 120, **arguments})
    elapsed = (time.perf_counter() - started) * 1000
    structured: dict[str, Any] = result.structured_content or {}
    if result.is_error or structured.get("exit_code") != 0:
        raise SystemExit(f"call failed: {arguments}: {result.content}")
    return elapsed


async def latencies(
    client: Client, arguments: dict[str, Any], runs: int, warmup: int, interval: float, vary: bool = False
) -> list[float]:
    samples: list[float] = []
    for i in range(warmup + runs):
        call = {**arguments, "code": f"{arguments['code']}// call {time.time_ns()}\n"} if vary else arguments
        elapsed = await timed_call(client, call)
        if i >= warmup:
            samples.append(elapsed)
        await anyio.sleep(interval)
    return samples


async def throughput(client: Client, calls: int, in_flight: int) -> float:
    limiter = anyio.CapacityLimiter(in_flight)

    async def one() -> None:
        async with limiter:
            await timed_call(client, HELLO["python print(1)"])

    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for _ in range(calls):
            tasks.start_soon(one)
    return calls / (time.perf_counter() - started)


# A burst of 16 calls lasts a fifth of a second: one is noise, the median of a few is the number.
THROUGHPUT_ROUNDS = 5


async def throughputs(client: Client) -> dict[str, Any]:
    """16 calls with 8 in flight, the median of a few rounds; then as many again beside CPU hogs that keep all
    of the machine's cores but one busy (at the same priority), as on a machine doing other work."""
    found: dict[str, Any] = {"settled_s": await settled()}
    for key, hogs in (("", 0), ("_beside_hogs", max((os.cpu_count() or 1) - 1, 1))):
        with cpu_hogs(hogs):
            rounds: list[float] = []
            for _ in range(THROUGHPUT_ROUNDS):
                rounds.append(round(await throughput(client, 16, 8), 1))
                await anyio.sleep(0.5)  # the pool refills between bursts, as between an agent's turns
        found[f"calls_per_s_16_calls_8_in_flight{key}"] = statistics.median(rounds)
        found[f"rounds_calls_per_s{key}"] = rounds
    found["cpu_hogs"] = max((os.cpu_count() or 1) - 1, 1)
    return found


async def settled(most: float = 60.0) -> float:
    """Wait until the machine is idle (under a fifth of a core busy over a second): the earlier scenarios leave
    pools refilling (a JVM, a build) that would take the cores from the burst. Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < most:
        before = cpu_time.busy_seconds()
        await anyio.sleep(1.0)
        if cpu_time.busy_seconds() - before < 0.2:
            break
    return round(time.perf_counter() - started, 1)


@contextlib.contextmanager
def cpu_hogs(count: int) -> Generator[None]:
    """`count` processes that spin on a core each until the block ends."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(count)
    ]
    try:
        time.sleep(0.2 if hogs else 0)  # running by the first call
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


async def start_and_stop(warm: bool) -> tuple[float, float]:
    """Milliseconds from spawning the server to its tools/list answer, and from closing its stdin to its exit;
    `warm`: a call first, and its pool refilled, so shutdown has sandboxes to remove."""
    started = time.perf_counter()
    async with Client(server()) as client:
        await client.list_tools()
        listed = (time.perf_counter() - started) * 1000
        if warm:
            await timed_call(client, HELLO["python print(1)"])
            await anyio.sleep(2.0)
        stopping = time.perf_counter()
    return listed, (time.perf_counter() - stopping) * 1000


def start_floor(runs: int) -> dict[str, float]:
    """What start-up costs before any code of ours runs, with the server's interpreter and environment: medians
    in milliseconds from spawning to the first line written (after the import), so the interpreter's own
    teardown, which the server skips, is not counted."""
    env = server().env

    def until_ready(code: str) -> float:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", f"{code}\nimport sys; sys.stdout.write('ready\\n'); sys.stdout.flush()"],
            stdout=subprocess.PIPE, env=env,
        )  # fmt: skip
        assert child.stdout is not None
        child.stdout.readline()
        elapsed = (time.perf_counter() - started) * 1000
        child.wait()
        child.stdout.close()
        return elapsed

    return {
        "interpreter start": round(statistics.median(until_ready("pass") for _ in range(runs)), 1),
        "import mcp.server (the official SDK)": round(
            statistics.median(until_ready("import mcp.server") for _ in range(runs)), 1
        ),
    }


def bytecode() -> str:
    """Whether the server's imports read compiled bytecode or compile their sources at every start."""
    env = server().env or {}
    cached = Path(importlib.util.cache_from_source(mcp.__file__)).exists()
    if env.get("PYTHONDONTWRITEBYTECODE") and not cached:
        return "sources compiled at every start: PYTHONDONTWRITEBYTECODE is set and nothing is compiled"
    return "compiled bytecode" if cached else "no bytecode yet, the first start writes it"


def floor(runs: int) -> dict[str, float]:
    """What the machine itself costs, with no server: medians in milliseconds."""

    def median_of(action: Callable[[], object]) -> float:
        samples: list[float] = []
        for _ in range(runs):
            started = time.perf_counter()
            action()
            samples.append((time.perf_counter() - started) * 1000)
        return round(statistics.median(samples), 1)

    found: dict[str, float] = {}
    # The system's interpreter, not a version manager's shim (a shell script that would be timed too).
    python = next((p for p in ("/usr/bin/python3", shutil.which("python3")) if p and os.path.exists(p)), sys.executable)

    def fork() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    found["fork of a warm interpreter"] = median_of(fork)
    bwrap = shutil.which("bwrap")
    if bwrap:
        argv = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc"]
        found["bwrap + python -S -c pass"] = median_of(
            lambda: subprocess.run([*argv, python, "-S", "-c", "pass"], check=True)
        )
    if shutil.which("docker") and os.environ.get("BACKEND", "docker") in ("docker", "auto"):
        container = subprocess.run(
            ["docker", "run", "-d", "--rm", "--network", "none", "python:3.12-slim", "sleep", "600"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        try:
            found["docker exec true"] = median_of(
                lambda: subprocess.run(["docker", "exec", container, "true"], check=True)
            )
        finally:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    return found


async def scenarios(client: Client, names: list[str], runs: int, warmup: int) -> dict[str, Any]:
    """Each scenario paced and back to back (a failing one is reported, the others still measured)."""
    found: dict[str, Any] = {}
    for name in names:
        try:
            vary = name in BUILT_EACH_CALL
            paced = await latencies(client, HELLO[name], runs, warmup, interval=1.0, vary=vary)
            back_to_back = await latencies(client, HELLO[name], runs, 0, interval=0.0, vary=vary)
        except SystemExit as exc:
            found[name] = {"failed": str(exc)[:300]}
            continue
        found[name] = {"paced": summary(paced), "back_to_back": summary(back_to_back)}
    return found


async def measure(runs: int, warmup: int, only: list[str], zygote: bool, start_stop: bool) -> dict[str, Any]:
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "backend": os.environ.get("BACKEND", "auto"),
        "runs": runs,
        "load_average_at_start": os.getloadavg(),
        "scenarios": {},
    }
    listed: list[float] = []
    stopped: list[float] = []
    stopped_warm: list[float] = []
    # Three of each beside the scenarios; as many as the other columns' runs when they are all there is.
    for _ in range(runs if start_stop else 3):
        start, stop = await start_and_stop(warm=False)
        listed.append(start)
        stopped.append(stop)
        stopped_warm.append((await start_and_stop(warm=True))[1])
    report["start_to_tools_list_ms"] = round(statistics.median(listed), 1)
    report["shutdown_ms"] = round(statistics.median(stopped), 1)
    report["shutdown_warm_pool_ms"] = round(statistics.median(stopped_warm), 1)
    report["start_floor_ms"] = start_floor(runs if start_stop else 5)
    report["bytecode"] = bytecode()
    names = [name for name in HELLO if not only or any(word in name for word in only)]
    if start_stop:
        report["floor_ms"] = floor(runs)
        report["load_average_at_end"] = os.getloadavg()
        return report
    # With --zygote the first server is the pool alone, to compare with (the zygote is on by default).
    async with Client(server({"SANDBOX_ZYGOTE": "false"} if zygote else None)) as client:
        report["scenarios"] = await scenarios(client, names, runs, warmup)
        report.update(await throughputs(client))
    if zygote:
        async with Client(server({"SANDBOX_ZYGOTE": "true"})) as client:
            python = [name for name in names if name.startswith("python")]
            report["zygote"] = {
                "scenarios": await scenarios(client, python, runs, warmup),
                **await throughputs(client),
            }
    report["floor_ms"] = floor(runs)
    report["load_average_at_end"] = os.getloadavg()
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['machine']} · backend {report['backend']} · {report['runs']} runs per column · load average "
        f"{report['load_average_at_start'][0]:.1f} at start, {report['load_average_at_end'][0]:.1f} at end",
        "",
        "| scenario | paced p50 / p95 | back to back p50 / p95 |",
        "|---|---|---|",
    ]
    zygote: dict[str, Any] = report.get("zygote") or {"scenarios": {}}
    rows = [*report["scenarios"].items(), *((f"zygote: {k}", v) for k, v in zygote["scenarios"].items())]
    for name, numbers in rows:
        if "failed" in numbers:
            lines.append(f"| {name} | failed | {numbers['failed'][:80]} |")
            continue
        paced, b2b = numbers["paced"], numbers["back_to_back"]
        spread = [f"{column['p50_ms']:.0f} / {column['p95_ms']:.0f} ms" for column in (paced, b2b)]
        lines.append(f"| {name} | {spread[0]} | {spread[1]} |")
    for prefix, source in (("", report), ("zygote: ", zygote)):
        for key, what in (("", ""), ("_beside_hogs", f", beside {source.get('cpu_hogs')} CPU hog(s)")):
            if f"calls_per_s_16_calls_8_in_flight{key}" in source:
                rate = source[f"calls_per_s_16_calls_8_in_flight{key}"]
                lines.append(f"| {prefix}16 calls, 8 in flight{what} | {rate} calls/s | |")
    lines += [
        f"| server start to tools/list | {report['start_to_tools_list_ms']:.0f} ms | |",
        f"| shutdown right after tools/list / with a warm pool | {report['shutdown_ms']:.0f} ms / "
        f"{report['shutdown_warm_pool_ms']:.0f} ms | |",
        "",
        "floor on this machine: " + "; ".join(f"{k} {v} ms" for k, v in report["floor_ms"].items()),
        "start-up floor (the server's interpreter and environment; "
        + report["bytecode"]
        + "): "
        + "; ".join(f"{k} {v} ms" for k, v in report["start_floor_ms"].items()),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--only", action="append", default=[], help="measure only scenarios whose name has this")
    parser.add_argument("--zygote", action="store_true", help="also measure Python with SANDBOX_ZYGOTE=true")
    parser.add_argument("--start-stop", action="store_true", help="measure only start-up, shutdown and the floors")
    parser.add_argument("--results", type=Path, help="directory of the result file (default: benchmarks/measured)")
    args = parser.parse_args()
    report = anyio.run(measure, args.runs, args.warmup, args.only, args.zygote, args.start_stop)
    sys.stdout.write(table(report) + "\n")
    record("table", report["backend"], report, args.results, short=args.runs < SHORT_RUNS)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
