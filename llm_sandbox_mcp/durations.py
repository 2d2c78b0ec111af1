"""Durations in the words people use: how a session's limits read to the model that opens one (the tool
descriptions) and in the message that says why one expired (the sessions)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """Seconds as a person says them: 8 h, 1.5 h, 30 min, 90 s."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 6 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
