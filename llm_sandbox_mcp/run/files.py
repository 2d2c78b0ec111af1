"""Files in and out of a session's workspace, and to and from the operator's allowed host directories.

Inside the sandbox every path is resolved by the sandbox itself and refused when it leaves /workspace
(through `..`, an absolute path or a symlink planted by the code). On the host, paths are resolved and
confined to SANDBOX_HOST_DIRS before anything is opened, and opened without following a final symlink.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import EngineStalled, FileTransferError, InvalidRequest
from llm_sandbox_mcp.models import ExecResult, SandboxRef
from llm_sandbox_mcp.run.transfer import safe_relative

# Not following a link, and not waiting for a FIFO's writer: only a regular file is read or written. Windows has
# neither flag nor FIFOs (and `_confined` has resolved links already); there the file must be opened as binary.
_REGULAR_ONLY = os.O_BINARY if sys.platform == "win32" else os.O_NOFOLLOW | os.O_NONBLOCK

_CONFINE = """
cd /workspace || exit 9
real=$(realpath -m -- "$1") || exit 9
case "$real" in /workspace|/workspace/*) ;; *) echo "refused: $1 leaves the workspace" >&2; exit 3;; esac
"""
_UPLOAD = (
    _CONFINE
    + """
dir=${real%/*}
mkdir -p -- "$dir" || exit 9
[ "$(cd -- "$dir" && pwd -P)" = "$dir" ] || { echo "refused: $1 goes through a symlink" >&2; exit 3; }
if [ -L "$real" ] || { [ -e "$real" ] && [ ! -f "$real" ]; }; then
    echo "refused: $1 exists and is not a regular file" >&2; exit 3
fi
exec cat > "$real"
"""
)
_DOWNLOAD = (
    _CONFINE
    + """
[ -e "$real" ] || { echo "no such file: $1" >&2; exit 4; }
[ -f "$real" ] || { echo "not a regular file: $1" >&2; exit 5; }
size=$(stat -c %s -- "$real")
[ "$size" -le "$2" ] || { echo "too large: $1 is $size bytes, the limit is $2 (SANDBOX_MAX_FILE_SIZE)" >&2; exit 6; }
exec cat -- "$real"
"""
)
_LIST = (
    _CONFINE
    + """
[ -d "$real" ] || { echo "not a directory: $1" >&2; exit 5; }
find "$real" -mindepth 1 -maxdepth 4 -printf '%y\\t%s\\t%P\\0' | head -z -n 2000
"""
)


@dataclass(frozen=True)
class FileEntry:
    path: str
    type: str
    size: int


class Files:
    """A sandbox's workspace, and the operator's allowed host directories."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        # The bound of one transfer. The sandbox's own code may stop (SIGSTOP) or starve what the server starts in
        # it, as the same user: the transfer ends then, with every process in the sandbox killed.
        self.deadline = 60.0

    async def _script(self, ref: SandboxRef, script: str, args: list[str], stdin: bytes = b"") -> ExecResult:
        stalled = (
            f"The sandbox did not answer within {self.deadline:g} s: its own code may be stopping or starving the "
            "processes the server starts in it. Every process in it was killed (a session's next cell starts a new "
            "interpreter); try again"
        )
        try:
            result = await self.backend.exec(
                ref,
                ["sh", "-c", script, "sh", *args],
                timeout=self.deadline,
                stdin=stdin,
                output_limit=self.settings.sandbox_max_file_size + 1,
            )
        except EngineStalled as exc:
            raise FileTransferError(stalled) from exc
        if result.timed_out:
            raise FileTransferError(stalled)
        if result.exit_code == 137:  # none of the scripts ends so by itself
            raise FileTransferError(
                "The transfer's process in the sandbox was killed (exit status 137): the sandbox's own code, or the "
                f"server at the transfer's deadline of {self.deadline:g} s, killed it; try again"
            )
        if result.exit_code != 0:
            message = result.stderr.decode("utf-8", errors="replace").strip() or f"exit status {result.exit_code}"
            raise FileTransferError(message)
        return result

    def _check_size(self, size: int) -> None:
        if size > self.settings.sandbox_max_file_size:
            limit = self.settings.sandbox_max_file_size
            raise FileTransferError(f"{size} bytes is above the limit of {limit} bytes (SANDBOX_MAX_FILE_SIZE)")

    async def upload(self, ref: SandboxRef, path: str, data: bytes) -> FileEntry:
        relative = safe_relative(path)
        self._check_size(len(data))
        await self._script(ref, _UPLOAD, [str(relative)], data)
        return FileEntry(str(relative), "file", len(data))

    async def download(self, ref: SandboxRef, path: str) -> bytes:
        relative = safe_relative(path)
        result = await self._script(ref, _DOWNLOAD, [str(relative), str(self.settings.sandbox_max_file_size)])
        return result.stdout

    async def list(self, ref: SandboxRef, path: str = ".") -> list[FileEntry]:
        relative = "." if path.strip() in ("", ".", "./") else str(safe_relative(path))
        result = await self._script(ref, _LIST, [relative])
        entries: list[FileEntry] = []
        for record in result.stdout.split(b"\0"):
            kind, _, rest = record.partition(b"\t")
            size, _, name = rest.partition(b"\t")
            if not name:
                continue
            label = {b"f": "file", b"d": "directory", b"l": "symlink"}.get(kind, "other")
            base = "" if relative == "." else relative + "/"
            entries.append(FileEntry(base + name.decode("utf-8", errors="replace"), label, int(size or 0)))
        return entries

    # Host side.

    def _roots(self) -> list[Path]:
        if not self.settings.sandbox_host_dirs:
            raise InvalidRequest(
                "Host files are disabled: the operator must list the directories file tools may use in "
                "SANDBOX_HOST_DIRS (none by default)"
            )
        return [Path(root).resolve() for root in self.settings.sandbox_host_dirs]

    def _confined(self, raw: str) -> Path:
        """The host path with every existing link resolved, inside an allowed directory, or InvalidRequest.

        Checked before anything is opened or tested for existence, so the answer for a path outside the
        allowed directories never depends on whether it exists.
        """
        path = Path(raw)
        if not path.is_absolute():
            raise InvalidRequest(f"Host path {raw!r} must be absolute")
        real = path.resolve()
        if not any(real == root or root in real.parents for root in self._roots()):
            raise InvalidRequest(f"Host path {raw!r} is outside the directories allowed by SANDBOX_HOST_DIRS")
        return real

    def _read_host(self, raw: str) -> bytes:
        real = self._confined(raw)
        try:
            fd = os.open(real, os.O_RDONLY | _REGULAR_ONLY)
        except FileNotFoundError:
            raise FileTransferError(f"No such host file: {raw}") from None
        except OSError as exc:
            raise FileTransferError(f"Cannot read host file {raw}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise FileTransferError(f"Host path {raw} is not a regular file")
            self._check_size(info.st_size)
            data = handle.read(self.settings.sandbox_max_file_size + 1)
        self._check_size(len(data))
        return data

    def _write_host(self, raw: str, data: bytes, overwrite: bool) -> str:
        target = self._confined(raw)
        if not target.parent.is_dir():
            raise FileTransferError(f"The host directory of {raw} does not exist")
        flags = os.O_WRONLY | os.O_CREAT | _REGULAR_ONLY | (0 if overwrite else os.O_EXCL)
        try:
            fd = os.open(target, flags, 0o644)
        except FileExistsError:
            raise FileTransferError(f"Host file {raw} exists; pass overwrite=true to replace it") from None
        except OSError as exc:
            raise FileTransferError(f"Cannot write host file {raw}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FileTransferError(f"Host path {raw} exists and is not a regular file")
            if sys.platform != "win32":  # Windows has no executable bit
                os.fchmod(fd, 0o644)  # never executable, whatever the file was before
            os.ftruncate(fd, 0)
            handle.write(data)
        return str(target)

    async def read_host(self, raw: str) -> bytes:
        return await anyio.to_thread.run_sync(self._read_host, raw)

    async def write_host(self, raw: str, data: bytes, overwrite: bool = False) -> str:
        return await anyio.to_thread.run_sync(self._write_host, raw, data, overwrite)
