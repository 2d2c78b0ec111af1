"""Bearer tokens from the operator's file (SANDBOX_HTTP_TOKENS_FILE), verified as the MCP SDK's TokenVerifier.

The file holds one `principal token` pair per line; a line whose first non-blank character is `#` is a
comment. One principal may have several tokens (to rotate them); a token names one principal only. The file
must be readable by its owner only. Errors name the file and the line, never a token. Verification compares
the token's digest with every known digest in constant time, so neither a match nor its place in the file
shows in the time it takes. `server/verifier.py` makes it the SDK's TokenVerifier, alone or with OAuth.

The file is read at start, where a fault stops the server, and again whenever it changes: a request looks at
the file's status (no more than once every RECHECK_SECONDS) and a changed file is read whole. A changed file
that fails the checks is refused with an error in the log, and the tokens read before stay in force until
the file is fixed.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.principals import NAME

SETTING = "SANDBOX_HTTP_TOKENS_FILE"
# Shorter tokens are guessable; 32 hexadecimal characters are 128 bits (`openssl rand -hex 32` gives 64).
MIN_TOKEN_LENGTH = 32
MAX_TOKEN_LENGTH = 512
MAX_FILE_BYTES = 1024**2
# How often, at most, a request looks whether the file changed (one stat call).
RECHECK_SECONDS = 1.0

logger = logging.getLogger(__name__)
# What tells one version of the file from another: a write changes the times and usually the size, a file
# renamed over it (or a Secret's new version, which a kubelet swaps in by a symbolic link) the inode.
_Signature = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class _Entry:
    principal: str
    digest: bytes


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", errors="surrogateescape")).digest()


def _refuse(path: Path, problem: str) -> ConfigError:
    return ConfigError([f"{SETTING} ({path}): {problem}"])


def kubelet_secret(info: os.stat_result) -> bool:
    """A Secret a kubelet mounted for a pod with `fsGroup`: root's, readable by the server's own group and no one
    else, written by no one but root (`defaultMode: 0400` becomes 0440 with the pod's group)."""
    if sys.platform == "win32":
        return False
    mode = stat.S_IMODE(info.st_mode)
    return info.st_uid == 0 != os.geteuid() and info.st_gid == os.getegid() and mode & 0o077 == 0o040


def _signature(info: os.stat_result) -> _Signature:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class TokenFile:
    """The principals and their tokens' digests: read at start, and again when the file changes."""

    def __init__(
        self,
        entries: list[_Entry],
        path: Path | None = None,
        signature: _Signature | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries = entries
        self._path = path
        self._signature = signature
        self._clock = clock
        self._checked = clock()

    @property
    def principals(self) -> list[str]:
        return sorted({entry.principal for entry in self._entries})

    def principal_of(self, token: str) -> str | None:
        """The principal `token` names, or None; the file is read again first if it changed."""
        self.recheck()
        digest = _digest(token)
        principal: str | None = None
        for entry in self._entries:
            # Every entry is compared, a match or not: the time taken says nothing about the token.
            if hmac.compare_digest(entry.digest, digest):
                principal = entry.principal
        return principal

    def recheck(self) -> None:
        """Read the file again if it changed since it was last read (looked at once per RECHECK_SECONDS at most).
        A new version that fails the checks is logged and left aside: the tokens in force stay in force."""
        path, now = self._path, self._clock()
        if path is None or now - self._checked < RECHECK_SECONDS:
            return
        self._checked = now
        try:
            signature: _Signature | None = _signature(path.stat())
        except OSError:
            signature = None
        if signature == self._signature:
            return  # unchanged, or still the version refused (or still gone), which was said once already
        self._signature = signature
        try:
            entries, self._signature = _read(path)
        except ConfigError as exc:
            logger.error("%s. The tokens read before stay in force until the file is fixed", exc)
            return
        self._entries = entries
        principals = sorted({entry.principal for entry in entries})
        logger.info("%s (%s) read again: %d token(s) of %s", SETTING, path, len(entries), ", ".join(principals))

    @classmethod
    def load(cls, path: Path, clock: Callable[[], float] = time.monotonic) -> TokenFile:
        """Read and check the file; raise ConfigError naming the file and the line at fault."""
        entries, signature = _read(path)
        return cls(entries, path, signature, clock)


def _read(path: Path) -> tuple[list[_Entry], _Signature]:
    """The file's entries and the signature of the version read; ConfigError naming the file and the line."""
    try:
        info = path.stat()
    except OSError as exc:
        raise _refuse(path, f"cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, "is not a regular file")
    if sys.platform != "win32" and info.st_mode & 0o077 and not kubelet_secret(info):
        raise _refuse(
            path,
            f"is readable or writable by others than its owner (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"make it private with: chmod 600 {path}",
        )
    if info.st_size > MAX_FILE_BYTES:
        raise _refuse(path, f"is larger than {MAX_FILE_BYTES} bytes; it should hold one short line per token")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise _refuse(path, f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8 text") from None
    return _parse(text, path), _signature(info)


def _parse(text: str, path: Path) -> list[_Entry]:
    entries: list[_Entry] = []
    lines: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        where = f"line {number}"
        if len(fields) != 2:
            raise _refuse(
                path, f"{where}: expected `principal token` (two fields separated by blanks), found {len(fields)}"
            )
        principal, token = fields
        if not NAME.fullmatch(principal):
            raise _refuse(
                path,
                f"{where}: the principal must be 1 to 64 letters, digits or . _ @ + - (starting with a letter "
                "or a digit)",
            )
        if not MIN_TOKEN_LENGTH <= len(token) <= MAX_TOKEN_LENGTH or not token.isascii() or not token.isprintable():
            raise _refuse(
                path,
                f"{where}: the token of {principal} must be {MIN_TOKEN_LENGTH} to {MAX_TOKEN_LENGTH} printable "
                "ASCII characters (make one with: openssl rand -hex 32)",
            )
        digest = _digest(token)
        if digest in lines:
            raise _refuse(path, f"{where}: the token of {principal} is the same as the one on line {lines[digest]}")
        lines[digest] = number
        entries.append(_Entry(principal, digest))
    if not entries:
        raise _refuse(path, "holds no `principal token` line")
    return entries
