"""An exclusive lock on a file, held across processes: `flock` on POSIX, `msvcrt.locking` on Windows.

Both are advisory between cooperating processes and released by the operating system when the holder exits,
so a process that is killed never leaves the lock taken. `locked` waits for the lock (callers run it in worker
threads); `ProcessLock` only tries, and may be held for a process's whole life (an image build's).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Generator
from pathlib import Path

if sys.platform == "win32":
    import msvcrt

    def _lock(fd: int) -> None:
        # LK_LOCK retries for 10 s and then raises; a holder may keep it longer, so wait on.
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
            except OSError as exc:
                if exc.errno != errno.EDEADLOCK:
                    raise
                continue
            return

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def locked(path: Path) -> Generator[None]:
    """Hold the exclusive lock on `path` (created if missing; its content is never touched) for the block."""
    with open(path, "a+b") as handle:
        # msvcrt locks a byte range from the current position: always the first byte, for every process.
        handle.seek(0)
        _lock(handle.fileno())
        try:
            yield
        finally:
            handle.seek(0)
            _unlock(handle.fileno())


class ProcessLock:
    """The lock on `path`, taken without waiting and kept until `release` or the process's end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock unless another process holds it; True when this one holds it now."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.lseek(fd, 0, os.SEEK_SET)  # msvcrt locks from the current position: the first byte, as `locked` does
        if not _try_lock(fd):
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            _unlock(fd)
        finally:
            os.close(fd)

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now."""
        if self._fd is not None:
            return False
        if not self.acquire():
            return True
        self.release()
        return False
