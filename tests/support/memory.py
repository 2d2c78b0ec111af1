"""The test process's memory growth over a window, as a peak of its current resident set.

`ru_maxrss` is the process's lifetime peak: once an earlier test has raised it, a later test's growth below that
peak reads as zero. Linux can reset the peak (`/proc/self/clear_refs` with `5` sets VmHWM to the current VmRSS),
so the peak read after the window is this window's own, measured from the resident set at its start.
"""

from __future__ import annotations

from pathlib import Path


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(f"/proc/self/status has no {field}")


class RssWindow:
    """Start a window: the resident set now, and the peak reset to it; `growth()` is the window's peak above it."""

    def __init__(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")
        self.start = _status_kib("VmRSS") * 1024

    def growth(self) -> int:
        """Bytes the resident set reached above the window's start, at its highest point so far."""
        return _status_kib("VmHWM") * 1024 - self.start

    @staticmethod
    def current() -> int:
        return _status_kib("VmRSS") * 1024
