"""A project image built in a process of its own: `llm-sandbox-mcp images build --language X`, started detached
(a new session on POSIX, DETACHED_PROCESS on Windows) so that it outlives the server that started it (an MCP
client closing its server mid-build loses nothing), under the image's `ProcessLock`, its output in a log file that
any server on this host reads for progress.

Where the lock and log live: beside the library cache index, named after the engine and the recipe.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_sandbox_mcp.cache_index import cache_home
from llm_sandbox_mcp.config import Settings, env_name
from llm_sandbox_mcp.file_lock import ProcessLock
from llm_sandbox_mcp.images import Recipe
from llm_sandbox_mcp.models import one_line

_TAIL_BYTES = 8192
_STEP = re.compile(r"^(?:Step|STEP) (\d+)/(\d+)")
# What `images build` writes when it fails, before the engine's message.
FAILED_PREFIX = "llm-sandbox-mcp: "


@dataclass(frozen=True)
class BuildFiles:
    """The lock and the log of one recipe's build on one engine."""

    lock: Path
    log: Path

    @classmethod
    def of(cls, engine: str, recipe: Recipe) -> BuildFiles:
        stem = cache_home() / "images" / f"{engine}-{recipe.language}-{recipe.digest[:16]}"
        return cls(stem.with_suffix(".lock"), stem.with_suffix(".log"))

    def locked(self) -> bool:
        """Whether a process builds this image now."""
        return ProcessLock(self.lock).held_elsewhere()

    def tail(self) -> list[str]:
        """The last lines of the log (text a build printed: shown only as single, cleaned lines)."""
        try:
            with open(self.log, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _TAIL_BYTES))
                data = log.read()
        except OSError:
            return []
        return [line for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]

    def progress(self) -> str:
        """Where the build is, from its log: 'step 3/4: <last line>', or '' before it printed anything."""
        lines = self.tail()
        steps = [match for match in (_STEP.match(line.strip()) for line in lines) if match]
        where = f"step {steps[-1].group(1)}/{steps[-1].group(2)}" if steps else ""
        last = one_line(lines[-1], 100) if lines else ""
        return ": ".join(part for part in (where, last) if part)

    def failure(self) -> str:
        """Why the last build failed, from its log: its first error line, or the last line."""
        lines = self.tail()
        errors = [line.removeprefix(FAILED_PREFIX) for line in lines if line.startswith(FAILED_PREFIX)]
        return one_line(errors[-1] if errors else lines[-1] if lines else "the build process ended", 300)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(value, dict):
        return ",".join(f"{key}={item}" for key, item in value.items())  # pyright: ignore[reportUnknownVariableType]
    return str(value)


def settings_env(settings: Settings, engine: str) -> dict[str, str]:
    """The environment that gives a child process these settings (which tests and embedders may have set
    without the environment), on the engine this server uses."""
    names = {env_name(field) for field in Settings.model_fields} | {"SANDBOX_MEMORY"}
    env = {key: value for key, value in os.environ.items() if key.upper() not in names}
    for field, value in settings.model_dump().items():
        if value is not None:
            env[env_name(field)] = _text(value)
    env["BACKEND"] = engine
    return env


def start(settings: Settings, engine: str, recipe: Recipe, files: BuildFiles) -> subprocess.Popen[bytes]:
    """Start `images build` for the recipe's language in a detached process, its output to the log."""
    argv = [sys.executable, "-m", "llm_sandbox_mcp", "images", "build", "--language", recipe.language]
    files.log.parent.mkdir(parents=True, exist_ok=True)
    # Appended to: where two servers start a build at once, the second waits for the first, both writing here.
    with open(files.log, "ab") as log:
        # Windows ignores start_new_session; elsewhere creationflags must stay 0.
        flags = 0
        if sys.platform == "win32":
            flags = subprocess.DETACHED_PROCESS | subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.CREATE_NO_WINDOW
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=settings_env(settings, engine),
            start_new_session=True,
            creationflags=flags,
        )
