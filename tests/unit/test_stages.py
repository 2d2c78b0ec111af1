"""SANDBOX_TRACE_STAGES: a call's account is kept stage by stage, in the order the call went through them, adds
up to no more than the call took, and nothing is kept or logged with the setting off."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import pytest
from mcp import Client

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.models import ExecResult, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.kernel import Kernel
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.stage_trace import PREFIX
from tests.support.fakes import Call, FakeBackend, ok
from tests.support.host_runners import HostRunners

pytestmark = pytest.mark.anyio

# What a one-shot Python call through the warm interpreter goes through, in order.
CALL = [
    "the SDK validates the arguments",
    "validate the request (once the engine is up)",
    "into the run's task",
    "wait for a slot",
    "the sandbox's spec (image, libraries)",
    "acquire a sandbox",
    "send the program",
    "the run: program, its files, its end reported",
    "shape the result",
    "give the sandbox back",
    "back in the call's task",
    "the result as MCP content",
    "the SDK shapes the answer",
]


def _accounts(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    lines = [record.getMessage() for record in caplog.records if record.name == "llm_sandbox_mcp.stages"]
    return [json.loads(line.removeprefix(PREFIX)) for line in lines]


@pytest.mark.parametrize("traced", [True, False])
async def test_a_calls_stages_are_kept_in_order_within_its_time_and_only_when_asked(
    traced: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    seen: list[bool] = []

    def run(call: Call) -> ExecResult:
        seen.append(stages.tracing())
        return ok(stdout=b"1\n")

    server = build_server(Settings(sandbox_trace_stages=traced, sandbox_zygote=False), FakeBackend(handler=run))
    async with Client(server) as client:
        started = time.perf_counter()
        result = await client.call_tool("execute_code", {"code": "print(1)"})
        wall_ms = (time.perf_counter() - started) * 1000
    assert result.structured_content is not None and result.structured_content["stdout"] == "1\n"
    executed = [account for account in _accounts(caplog) if account["tool"] == "execute_code"]
    if not traced:
        assert executed == [] and _accounts(caplog) == [] and seen[-1] is False
        return
    assert seen[-1] is True
    (account,) = executed
    assert account["method"] == "tools/call"
    assert [stage["stage"] for stage in account["stages"]] == CALL
    assert all(stage["ms"] >= 0 for stage in account["stages"])
    assert sum(stage["ms"] for stage in account["stages"]) == pytest.approx(account["total_ms"], abs=0.01)
    assert account["total_ms"] <= wall_ms
    assert account["notes"] == {"source": "the warm pool", "sandbox": "ready"} or account["notes"] == {
        "source": "the warm pool",
        "sandbox": "made for the call",
    }
    # Only names and times: nothing of the code or its output.
    assert "print(1)" not in json.dumps(account) and '"1\\n"' not in json.dumps(account)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the runners run in Linux namespaces")
async def test_a_runners_own_readings_split_the_run_and_stay_between_the_servers() -> None:
    host = HostRunners()
    try:
        kernel = await Kernel.start(host, SandboxRef("py", SandboxSpec("python", Limits())), {}, preload=False)
        with stages.recording() as account:
            sent = time.perf_counter()
            result = await kernel.run(
                "print(1)",
                mode="fork",
                echo=False,
                filename="/tmp/work/main.py",
                timeout=20,
                output_limit=65536,
                artifact_limit=1024,
            )
            back = time.perf_counter()
    finally:
        await host.aclose()
    assert result.exit_code == 0 and result.stdout == b"1\n"
    names = [stage for stage, _ in account.marks]
    assert names == [
        "send the program",
        "the request's way to the runner",
        "the program, from its request to its exit",
        "after its exit: the rest killed, its files found",
        "the end's way back to the server",
    ]
    readings = [at for _, at in account.marks]
    assert readings == sorted(readings) and sent <= readings[0] and readings[-1] <= back


def test_readings_that_are_not_numbers_or_lie_are_never_believed() -> None:
    with stages.recording() as account:
        account.mark("before")
        assert not stages.reported(["a", "b"], [1.0])  # not one per stage
        assert not stages.reported(["a"], [True])  # a boolean is no reading
        assert not stages.reported(["a"], "1.0")
        assert [stage for stage, _ in account.marks] == ["before"]
        # A reading from before the last mark, or from the future, is kept between it and now.
        assert stages.reported(["past", "future"], [0.0, time.perf_counter() + 3600])
    (_, before), (_, past), (_, future) = account.marks
    assert before == past <= future <= time.perf_counter()
    assert not stages.reported(["a"], [1.0])  # no account kept: nothing to mark


def test_marks_outside_an_account_cost_a_lookup_and_record_nothing() -> None:
    stages.mark("nobody asked")
    stages.note("source", "nowhere")
    assert not stages.tracing()
    with stages.recording() as account:
        stages.mark("asked")
    stages.mark("after")
    assert [stage for stage, _ in account.marks] == ["asked"]
