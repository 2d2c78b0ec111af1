"""The adaptor over blocking engines bounds every engine call by the call's own timeout, however the engine hangs.

No real engine can be made to hang on request: this engine's exec blocks in its worker thread until the
sandbox's processes are killed, as a Docker exec whose start never returns does until the container is killed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import PurePosixPath

import anyio
import anyio.to_thread
import pytest

from llm_sandbox_mcp.backends import SandboxProcess
from llm_sandbox_mcp.backends._threaded import Threaded
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import ExecResult, Limits, OutputListener, SandboxRef, SandboxSpec

pytestmark = pytest.mark.anyio


class HungEngine:
    name = "hung"
    install_network = "none"
    template_containers = False

    def __init__(self) -> None:
        self.killed = threading.Event()
        self.returned = threading.Event()
        self.calls = 0

    def create(self, spec: SandboxSpec, track: Callable[[str], None], /) -> str:
        track("hung-1")
        return "hung-1"

    def exec(
        self,
        ref: SandboxRef,
        argv: list[str],
        timeout: float,
        stdin: bytes,
        env: dict[str, str],
        workdir: PurePosixPath,
        output_limit: int | None,
        on_output: OutputListener | None,
        /,
    ) -> ExecResult:
        self.calls += 1
        self.killed.wait(timeout=600)
        self.returned.set()
        return ExecResult(exit_code=137, stdout=b"", stderr=b"", duration_ms=0)

    def start(self, ref: SandboxRef, argv: list[str], env: dict[str, str], workdir: PurePosixPath) -> SandboxProcess:
        raise SandboxFailure("not used")

    def kill_all(self, ref: SandboxRef, /) -> None:
        self.killed.set()

    def remove(self, sandbox_id: str, /) -> None:
        self.killed.set()

    def drop_cache(self, key: str, /) -> None:
        return None

    def sweep(self) -> int:
        return 0

    def describe(self) -> str:
        return "hung engine"

    def close(self) -> None:
        return None


async def test_an_exec_hung_in_the_engine_ends_after_its_timeout_and_grace_with_its_processes_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("llm_sandbox_mcp.backends._threaded.ENGINE_GRACE", 0.5)
    engine = HungEngine()
    backend = Threaded(engine)
    ref = await backend.create(SandboxSpec("img", Limits()))
    with anyio.fail_after(30), pytest.raises(SandboxFailure, match="did not finish a 0.5 s run within 1 s"):
        await backend.exec(ref, ["sleep", "1000"], timeout=0.5)
    assert engine.killed.is_set(), "the abandoned call's sandbox processes were killed so its thread can return"
    assert await anyio.to_thread.run_sync(engine.returned.wait, 30), "the abandoned thread returned"
    await backend.aclose()


async def test_a_cancelled_caller_waits_for_a_hung_engine_call_only_up_to_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("llm_sandbox_mcp.backends._threaded.ENGINE_GRACE", 0.5)
    engine = HungEngine()
    backend = Threaded(engine)
    ref = await backend.create(SandboxSpec("img", Limits()))
    with anyio.fail_after(30):
        with anyio.move_on_after(0.2) as scope:
            await backend.exec(ref, ["sleep", "1000"], timeout=0.5)
        assert scope.cancelled_caught
    assert engine.killed.is_set(), "the hung call's sandbox processes were killed so its thread can return"
    await backend.aclose()


async def test_a_call_cancelled_before_its_thread_took_it_up_returns_at_once_and_never_runs() -> None:
    engine = HungEngine()
    backend = Threaded(engine)
    ref = await backend.create(SandboxSpec("img", Limits()))
    with anyio.fail_after(30):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await backend.exec(ref, ["sleep", "1000"], timeout=300)
    await anyio.sleep(0.2)  # a thread that had taken the call up would have run it by now
    assert engine.calls == 0
    await backend.aclose()


class _Process:
    """A started process whose streams are open until closed."""

    def __init__(self) -> None:
        self.closed = False

    async def send(self, data: bytes) -> None:
        return None

    async def receive(self, timeout: float) -> bytes | None:
        return None

    def stderr_tail(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        self.closed = True


class SlowStartEngine(HungEngine):
    """An engine whose start takes a while (as a busy engine's attach does) and then succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[_Process] = []
        self.starting = threading.Event()

    def start(self, ref: SandboxRef, argv: list[str], env: dict[str, str], workdir: PurePosixPath) -> SandboxProcess:
        self.starting.set()
        time.sleep(0.5)
        self.started.append(_Process())
        return self.started[-1]


async def test_a_process_started_for_a_caller_cancelled_meanwhile_is_closed_not_dropped() -> None:
    engine = SlowStartEngine()
    backend = Threaded(engine)
    ref = await backend.create(SandboxSpec("img", Limits()))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(backend.start, ref, ["python3"])
            await anyio.to_thread.run_sync(engine.starting.wait)
            tasks.cancel_scope.cancel()
    [process] = engine.started
    assert process.closed, "the process the engine started after its caller was cancelled still has open streams"
    await backend.aclose()
