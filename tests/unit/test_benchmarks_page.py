"""docs/benchmarks.md is what benchmarks/render.py makes of the committed result files, and those files say
where and when their numbers were measured."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mcp import Client

from llm_sandbox_mcp.cli import LOG_FORMAT
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import FakeBackend

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "measured"


def _renderer() -> ModuleType:
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.append(str(ROOT / "benchmarks"))  # its sibling modules, as when it runs as a script
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "benchmarks" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(date: str, report: dict[str, Any], backend: str = "docker") -> dict[str, Any]:
    machine = {"cpu": "Test CPU", "cores": 2, "memory_gib": 4.0, "kernel": "Linux 6.1", "engines": {"docker": "26"}}
    return {"benchmark": "table", "backend": backend, "date": date, "machine": machine, "report": report}


def test_the_page_is_what_the_result_files_make() -> None:
    render = _renderer()
    expected = render.render(render.load(RESULTS))
    assert (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8") == expected, (
        "docs/benchmarks.md is out of date: run python benchmarks/render.py"
    )


def test_the_readme_quotes_the_result_files_through_its_generated_speed_table() -> None:
    render = _renderer()
    assert (ROOT / "README.md").read_text(encoding="utf-8") == render.readme(render.load(RESULTS)), (
        "README.md's speed table is out of date: run python benchmarks/render.py"
    )


def test_the_speed_table_takes_each_engines_newest_full_run_and_says_by_how_much_a_target_is_missed() -> None:
    render = _renderer()

    def table(date: str, backend: str, print_ms: float, rate: float) -> dict[str, Any]:
        report = {
            "scenarios": {"python print(1)": {"back_to_back": {"p50_ms": print_ms}}},
            "calls_per_s_16_calls_8_in_flight": rate,
            "load_average_at_start": [1.5],
            "load_average_at_end": [2.5],
        }
        return _result(date, report, backend)

    results = [
        table("2026-01-01T00:00:00Z", "bubblewrap", 30, 50),
        table("2026-02-01T00:00:00Z", "bubblewrap", 16, 150),  # the newest full run: its numbers
        {**table("2026-03-01T00:00:00Z", "bubblewrap", 5, 500), "short": True},  # never a short one
        table("2026-02-01T00:00:00Z", "docker", 11, 30),
    ]
    section = render.speed_table(results, render._machine)  # pyright: ignore[reportPrivateUsage]
    row = next(line for line in section.splitlines() if line.startswith("| `print(1)`"))
    assert row == "| `print(1)`, back to back, p50 | 16 ms ✗ (2.0× off) | 11 ms | — | — | ≤ 8 / 12 / 12 / 15 ms |"
    row = next(line for line in section.splitlines() if line.startswith("| 16 calls, 8 in flight |"))
    assert "| 150 calls/s | 30 calls/s ✗ (2.0× off) |" in row
    assert "2026-01-01" not in section and "2026-03-01" not in section
    assert "load average 1.5 to 2.5" in section and "Test CPU, 2 cores" in section
    with pytest.raises(ValueError, match="markers"):
        render.replace_section("# A README without the markers\n", section)


def test_cpu_time_is_accounted_to_the_server_and_the_client_by_their_own_clocks() -> None:
    """The machine-wide total depends on what else runs (other test workers here), so only the two processes'
    own CPU time is checked: the "server" spins 0.4 s of CPU during the calls, the client 0.2 s."""
    import anyio
    import anyio.to_thread

    spec = importlib.util.spec_from_file_location("cpu_time_benchmark", ROOT / "benchmarks" / "cpu_time.py")
    assert spec is not None and spec.loader is not None
    cpu_time: Any = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cpu_time  # its dataclass looks its module up there
    spec.loader.exec_module(cpu_time)
    spin = "import sys, time\nsys.stdin.readline()\nend = time.process_time() + 0.4\n"
    spin += "while time.process_time() < end: pass"
    server = subprocess.Popen(
        [sys.executable, "-c", spin + "\nprint('spun', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout

    async def calls() -> None:
        stdin.write("go\n")
        stdin.flush()
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
        assert await anyio.to_thread.run_sync(stdout.readline) == "spun\n"

    try:
        account: Any = anyio.run(cpu_time.account, server.pid, 10, calls)
    finally:
        server.kill()
        server.wait()
        stdin.close()
        stdout.close()
    assert account.calls == 10
    assert 38 <= account.server_ms <= 60  # 0.4 s over 10 calls (clock ticks of 10 ms)
    assert 18 <= account.client_ms <= 40  # 0.2 s over 10 calls, and the client's own bookkeeping
    assert account.as_dict(2)["ceiling_calls_per_s"] == round(2000 / max(account.total_ms, 0.01), 1)


def test_every_result_file_names_its_machine_date_and_benchmark() -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files
    for path in files:
        result = json.loads(path.read_text(encoding="utf-8"))
        assert {"benchmark", "backend", "date", "machine", "report", "source"} <= set(result), path.name
        assert result["date"][:4].isdigit() and result["machine"].get("cores"), path.name


def test_a_row_measured_again_is_shown_only_from_the_newer_run() -> None:
    render = _renderer()
    floor = {"fork of a warm interpreter": 3.0}
    old = _result(
        "2026-01-01T00:00:00Z",
        {
            "scenarios": {
                "python print(1)": {"paced": {"p50_ms": 111, "p95_ms": 112}, "back_to_back": {"p50_ms": 113}},
                "ruby hello": {"paced": {"p50_ms": 121, "p95_ms": 122}, "back_to_back": {"p50_ms": 123}},
            },
            "floor_ms": floor,
        },
    )
    new = _result(
        "2026-02-01T00:00:00Z",
        {
            "scenarios": {
                "python print(1)": {"paced": {"p50_ms": 211, "p95_ms": 212}, "back_to_back": {"p50_ms": 213}}
            },
            "floor_ms": {"fork of a warm interpreter": 4.5},
        },
    )
    gone = _result("2025-12-01T00:00:00Z", {"scenarios": {"ruby hello": {"paced": {"p50_ms": 777}}}})
    smoke = {
        **_result("2026-03-01T00:00:00Z", {"scenarios": {"ruby hello": {"paced": {"p50_ms": 888}}}}),
        "short": True,
    }
    page = render.render([gone, old, new, smoke])
    assert "| python print(1) | 211 / 212 ms | 213 / — ms |" in page
    assert "111" not in page and "777" not in page and "2025-12-01" not in page
    assert "| ruby hello | 121 / 122 ms | 123 / — ms |" in page
    # A short run is shown apart, after the full runs, and replaces none of their rows.
    assert (
        page.index("| ruby hello | 888 / — ms | — / — ms |") > page.index("### Short run: docker") > page.index("121")
    )
    assert page.index("2026-02-01") < page.index("2026-01-01")  # newest first
    assert "Test CPU, 2 cores, 4 GiB, Linux 6.1, docker 26" in page
    assert "fork of a warm interpreter 4.5 ms" in page and "fork of a warm interpreter 3 ms" in page


def _stages_benchmark(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # pyright: ignore[reportUnknownMemberType]
    spec = importlib.util.spec_from_file_location("stages_benchmark", ROOT / "benchmarks" / "stages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_the_stage_benchmark_reads_the_accounts_the_server_writes_on_stderr(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = build_server(Settings(sandbox_trace_stages=True, sandbox_zygote=False), FakeBackend())
    walls: list[float] = []
    async with Client(server) as client:
        for _ in range(3):
            started = time.perf_counter()
            await client.call_tool("execute_code", {"code": "print(1)"})
            walls.append((time.perf_counter() - started) * 1000)
        await client.call_tool("list_sessions", {})
    # The server's stderr as it writes it: its log format, other lines between, and a last line cut short.
    formatter = logging.Formatter(LOG_FORMAT)
    lines = [formatter.format(record) for record in caplog.records]
    stderr = "\n".join(["2026-01-01 00:00:00,000 INFO llm_sandbox_mcp.backends: engine found", *lines])
    stderr += '\n2026-01-01 00:00:01,000 INFO llm_sandbox_mcp.stages: stages {"id": 9, "method": "tools/ca'
    stages = _stages_benchmark(monkeypatch)
    accounts = stages.parse_accounts(stderr)
    executed = [account for account in accounts if account["tool"] == "execute_code"]
    assert len(executed) == 3 and [a["tool"] for a in accounts].count("list_sessions") == 1
    owners = stages.owners(walls, executed)
    # The stages' means and what is outside the server's account add up to the mean call.
    assert sum(owners["stages_mean_ms"].values()) == pytest.approx(owners["mean_ms"], abs=0.05)
    assert list(owners["stages_mean_ms"])[:2] == [stages.OUTSIDE, "the SDK validates the arguments"]
    assert owners["sandboxes"] in (
        {"the warm pool / ready": 3},
        {"the warm pool / made for the call": 1, "the warm pool / ready": 2},
    )
    with pytest.raises(ValueError, match="3 calls timed but 2 accounts"):
        stages.owners(walls, executed[:2])
    # And the page shows it as a table per engine, beside the floors.
    report = {
        "engines": {"fake": {"print(1) back to back": owners, "floor: tools/list round trip": {"p50_ms": 1.5}}},
        "floor_ms": {"fork of a warm interpreter": 3.0},
    }
    page = _renderer().render([{**_result("2026-01-01T00:00:00Z", report, "fake"), "benchmark": "stages"}])
    assert "## Where a call's time goes (`benchmarks/stages.py`)" in page and "| ms | fake |" in page
    assert "| · the SDK validates the arguments | " in page and "| floor: `tools/list` round trip, p50 | 1.5 |" in page
