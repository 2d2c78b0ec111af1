"""An exclusive lock on a file, held across processes: `flock` on POSIX, `msvcrt.locking` on Windows.

Both are advisory between cooperating processes and released by the operating system when the holder exits,
so a server that is killed never leaves the lock taken. Blocking: callers run it in worker threads.
"""

from __future__ import annotations

import contextlib
import errno
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

    def _unlock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

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
