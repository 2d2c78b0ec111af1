"""Every socket connect this test process makes, as Python's audit hooks report it (proof that the proxy
did not try an address it refused)."""

from __future__ import annotations

import sys
from collections.abc import Generator
from contextlib import contextmanager

_recording: list[list[object]] = []


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event == "socket.connect" and _recording:
        for record in _recording:
            record.append(args[1])


sys.addaudithook(_hook)


@contextmanager
def recorded() -> Generator[list[object]]:
    """The addresses connected to (tuples for IP sockets, paths for UNIX sockets) while inside."""
    record: list[object] = []
    _recording.append(record)
    try:
        yield record
    finally:
        _recording.remove(record)
