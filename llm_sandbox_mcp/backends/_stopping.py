"""Killing what runs in a sandbox while its output is still being read.

Where an engine passes a process's output on without buffering it, a process killed while nobody reads that
output is not gone: on Podman it stays a zombie until conmon has passed its last output on; on Kubernetes (seen
against the API double, whose exec streams are backed by Docker's) the exec that asks PID 1 to kill got no status
while another stream of the pod went unread. A kill that waited for its proof with the output unread then waited
out its whole bound (`_container.KILL_SECONDS`, 30 s) and removed the sandbox instead.

So a run's own stream loop kills from a thread of its own and reads on meanwhile (`Stopping`), and a backend kills
a sandbox while reading on every process it started there (`draining`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import Protocol

# While a kill runs, how often a loop that reads on looks whether it has ended (output ends a wait at once).
POLL_SECONDS = 0.05
# Once the stop has returned, how long a loop still reads what the stopped processes left in the stream.
DRAIN_SECONDS = 3.0
# How much of a started process's output read during a kill is kept for its next `receive`; the rest is dropped.
HELD = 1024 * 1024


class Stopping:
    """`stop` called once, in a thread of its own; `wait` joins it and raises what it raised."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="run-stop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._stop()
        except BaseException as exc:  # handed to the thread that waits
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class StopClock:
    """A run's read loop and its deadline: until it, the loop waits for output; past it (or `stop_now`), `stop`
    runs in a thread of its own (`Stopping`) while the loop reads on; once `stop` has returned, the loop reads on
    for DRAIN_SECONDS at most. `before_stop` runs first, in the loop's thread."""

    def __init__(
        self, deadline: float, stop: Callable[[], None], before_stop: Callable[[], None] | None = None
    ) -> None:
        self._deadline = deadline
        self._stop = stop
        self._before_stop = before_stop
        self._stopping: Stopping | None = None
        self._hard_stop = float("inf")

    @property
    def stopped(self) -> bool:
        """Whether the stop was started (the deadline passed, or `stop_now`)."""
        return self._stopping is not None

    def stop_now(self) -> None:
        """Stop as at the deadline (e.g. output past its read budget)."""
        self._deadline = min(self._deadline, time.monotonic())

    def wait(self) -> float | None:
        """How long the loop may wait for its next output now (at most 1 s); None when it must end."""
        now = time.monotonic()
        if self._stopping is None and now >= self._deadline:
            if self._before_stop is not None:
                self._before_stop()
            self._stopping = Stopping(self._stop)
        if self._stopping is not None and self._hard_stop == float("inf") and self._stopping.done:
            self._hard_stop = now + DRAIN_SECONDS
        if now >= self._hard_stop:
            return None
        if self._stopping is None:
            wait = self._deadline - now
        elif self._stopping.done:
            wait = self._hard_stop - now
        else:
            wait = POLL_SECONDS
        return max(0.0, min(wait, 1.0))

    def finish(self) -> None:
        """Wait for a started stop to return, raising what it raised."""
        if self._stopping is not None:
            self._stopping.wait()


class Drainable(Protocol):
    def drain(self, until: threading.Event) -> None:
        """Read on (keeping at most HELD bytes) until `until` is set or the stream ends."""
        ...


@contextlib.contextmanager
def draining(processes: Iterable[Drainable]) -> Generator[None]:
    """Every one of `processes` read on, each in a thread of its own, while the body runs."""
    until = threading.Event()
    threads = [threading.Thread(target=p.drain, args=(until,), name="exec-drain", daemon=True) for p in processes]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        until.set()
        for thread in threads:
            thread.join()
