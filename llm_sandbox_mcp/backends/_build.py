"""The build log both engines stream (JSON objects with `stream`, `status` or `error`), read as lines."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from typing import cast

from llm_sandbox_mcp.errors import SandboxFailure

_TAIL_LINES = 12


def follow(chunks: Iterable[object], on_line: Callable[[str], None], what: str) -> None:
    """Pass each log line to `on_line`; raise SandboxFailure, with the last lines, when the build reports an error."""
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    stream = iter(chunks)
    for chunk in stream:
        entry = _entry(chunk)
        error = entry.get("error")
        if error:
            for _ in stream:  # read to the end, so the engine's response is complete and its connection freed
                pass
            lines = "\n".join(tail)
            raise SandboxFailure(
                f"{what} failed: {str(error).strip()}" + (f"\nlast lines of the build:\n{lines}" if lines else "")
            )
        text = entry.get("stream") or entry.get("status")
        if not isinstance(text, str):
            continue
        for line in text.splitlines():
            if line.strip():
                tail.append(line.rstrip())
                on_line(line.rstrip())


def _entry(chunk: object) -> dict[str, object]:
    if isinstance(chunk, bytes):
        chunk = chunk.decode("utf-8", errors="replace")
    if isinstance(chunk, str):
        try:
            chunk = json.loads(chunk) if chunk.strip() else {}
        except json.JSONDecodeError:
            return {"stream": chunk}
    if isinstance(chunk, dict):
        return {str(key): value for key, value in cast(dict[object, object], chunk).items()}
    return {}
