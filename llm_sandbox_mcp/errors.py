"""Errors whose message is read by the model (or the operator), so each one says what to do.

SandboxError                 base; str(e) is what the client reads
├── ConfigError              bad environment at start-up, one line per variable
├── BackendUnavailable       SDK missing or engine unreachable
├── ImageMissing             the configured image is not on the engine
├── InvalidRequest           a tool argument the model can fix (language, library, timeout, path)
├── InstallFailed            a library install failed; carries the installer's output
├── SandboxNotFound          unknown, expired or closed sandbox or session
├── FileTransferError        a path outside the workspace, a missing file, a size cap
├── SandboxFailure           the engine failed while running a sandbox
└── OverBudget               the sandboxes of this server hold all the memory it may give them
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(SandboxError):
    """The environment holds invalid settings; each line names one variable."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class BackendUnavailable(SandboxError):
    """The selected engine cannot be used: its SDK is missing or it does not answer."""


class ImageMissing(SandboxError):
    """The image a language needs is not present on the engine."""


class InvalidRequest(SandboxError):
    """A tool argument is wrong in a way the caller can correct."""


class InstallFailed(SandboxError):
    """Installing the requested libraries failed."""


class SandboxNotFound(SandboxError):
    """The sandbox or session does not exist (any more)."""


class FileTransferError(SandboxError):
    """A file could not be moved in or out of a sandbox."""


class SandboxFailure(SandboxError):
    """The engine failed while creating or running a sandbox."""


class EngineStalled(SandboxFailure):
    """An engine call on a sandbox did not return within its bound (the sandbox's processes were killed)."""


class OverBudget(SandboxError):
    """Another sandbox would pass the server's memory budget (SANDBOX_MEMORY_BUDGET)."""
