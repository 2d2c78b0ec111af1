"""SANDBOX_TRACE_STAGES: a call's account, stage by stage, from the request reaching the server's own code to
its result leaving it (benchmarks/stages.py reads it from the server's stderr).

With the setting on, the server (`server/stage_trace.py`) opens one `Stages` per request and logs it when the
answer is ready; code on a call's path marks where each stage ends (`mark`), and the account is each stage's
time, in order. With it off nothing is opened, and `mark` is one lookup that finds nothing. The account
carries no code, output or argument: only stage names, where the call's sandbox came from, and times.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

# Each request runs in a task of its own and the tasks it starts copy its context, so a call's marks reach its
# own account whichever task of the call makes them.
_current: ContextVar[Stages | None] = ContextVar("llm_sandbox_mcp_stages", default=None)


@dataclass(eq=False)
class Stages:
    """The account of one request: `marks` are (the stage that just ended, when), `notes` what a stage chose."""

    started: float = field(default_factory=time.perf_counter)
    marks: list[tuple[str, float]] = field(default_factory=lambda: list[tuple[str, float]]())
    notes: dict[str, str] = field(default_factory=lambda: dict[str, str]())

    def mark(self, stage: str, at: float | None = None) -> None:
        """`stage` ended now, or at `at` (a reading of the monotonic clock), kept between the last mark and now."""
        now = time.perf_counter()
        if at is not None:
            now = min(max(at, self.marks[-1][1] if self.marks else self.started), now)
        self.marks.append((stage, now))

    def account(self) -> dict[str, object]:
        """The stages in order with their milliseconds, and the total from the start to the last mark."""
        stages: list[dict[str, object]] = []
        previous = self.started
        for stage, at in self.marks:
            stages.append({"stage": stage, "ms": round((at - previous) * 1000, 3)})
            previous = at
        return {"total_ms": round((previous - self.started) * 1000, 3), "stages": stages, "notes": dict(self.notes)}


def mark(stage: str) -> None:
    """The current call's `stage` ends now (nothing when no account is being kept)."""
    stages = _current.get()
    if stages is not None:
        stages.mark(stage)


def reported(stages: list[str], readings: object) -> bool:
    """Mark `stages` at a runner's `readings` of the monotonic clock, one each (the host's clock: no engine here
    gives a sandbox a time namespace; each is kept between the marks around it whatever it says). False, and
    nothing marked, when no account is kept or the readings are not as many numbers as stages."""
    current = _current.get()
    if current is None or not isinstance(readings, list):
        return False
    numbers: list[object] = list(readings)  # pyright: ignore[reportUnknownArgumentType]
    if len(numbers) != len(stages):
        return False
    values: list[float] = []
    for value in numbers:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        values.append(float(value))
    for stage, at in zip(stages, values, strict=True):
        current.mark(stage, at)
    return True


def tracing() -> bool:
    """Whether an account is being kept (to spare working out a note nobody reads)."""
    return _current.get() is not None


def note(key: str, value: str) -> None:
    """Say what a stage chose (where the sandbox came from, say), when an account is being kept."""
    stages = _current.get()
    if stages is not None:
        stages.notes[key] = value


@contextmanager
def recording() -> Generator[Stages]:
    """Keep the account of the work inside the block (and of the tasks it starts)."""
    stages = Stages()
    token = _current.set(stages)
    try:
        yield stages
    finally:
        _current.reset(token)
