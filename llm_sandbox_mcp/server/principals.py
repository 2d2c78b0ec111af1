"""Who is calling: the principal a call runs for, set by the HTTP face for the length of the call.

Over stdio there is one implicit principal, `LOCAL`; over HTTP it is the name the verified token maps to.
The run core keys sessions and jobs by this name and knows nothing of where it came from.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar

LOCAL = ""
# What a principal's name may hold: it goes into log lines and error texts as it is.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")

_caller: ContextVar[str] = ContextVar("llm_sandbox_mcp_caller", default=LOCAL)


def caller() -> str:
    """The principal of the call being served."""
    return _caller.get()


@contextmanager
def acting_for(principal: str) -> Generator[None]:
    token = _caller.set(principal)
    try:
        yield
    finally:
        _caller.reset(token)
