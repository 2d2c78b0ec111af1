"""Bearer tokens from the operator's file (SANDBOX_HTTP_TOKENS_FILE), verified as the MCP SDK's TokenVerifier.

The file holds one `principal token` pair per line; a line whose first non-blank character is `#` is a
comment. One principal may have several tokens (to rotate them); a token names one principal only. The file
must be readable by its owner only. Errors name the file and the line, never a token. Verification compares
the token's digest with every known digest in constant time, so neither a match nor its place in the file
shows in the time it takes. `server/verifier.py` makes it the SDK's TokenVerifier, alone or with OAuth.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.principals import NAME

SETTING = "SANDBOX_HTTP_TOKENS_FILE"
# Shorter tokens are guessable; 32 hexadecimal characters are 128 bits (`openssl rand -hex 32` gives 64).
MIN_TOKEN_LENGTH = 32
MAX_TOKEN_LENGTH = 512
MAX_FILE_BYTES = 1024**2


@dataclass(frozen=True)
class _Entry:
    principal: str
    digest: bytes


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", errors="surrogateescape")).digest()


def _refuse(path: Path, problem: str) -> ConfigError:
    return ConfigError([f"{SETTING} ({path}): {problem}"])


def _kubernetes_secret(info: os.stat_result) -> bool:
    """A Secret a kubelet mounted for a pod with `fsGroup`: root's, readable by the server's own group and no one
    else, written by no one but root (`defaultMode: 0400` becomes 0440 with the pod's group)."""
    if sys.platform == "win32":
        return False
    mode = stat.S_IMODE(info.st_mode)
    return info.st_uid == 0 != os.geteuid() and info.st_gid == os.getegid() and mode & 0o077 == 0o040


class TokenFile:
    """The principals and their tokens' digests, read once at start (restart the server to change them)."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries

    @property
    def principals(self) -> list[str]:
        return sorted({entry.principal for entry in self._entries})

    def principal_of(self, token: str) -> str | None:
        """The principal `token` names, or None."""
        digest = _digest(token)
        principal: str | None = None
        for entry in self._entries:
            # Every entry is compared, a match or not: the time taken says nothing about the token.
            if hmac.compare_digest(entry.digest, digest):
                principal = entry.principal
        return principal

    @classmethod
    def load(cls, path: Path) -> TokenFile:
        """Read and check the file; raise ConfigError naming the file and the line at fault."""
        try:
            info = path.stat()
        except OSError as exc:
            raise _refuse(path, f"cannot be read: {exc.strerror or exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, "is not a regular file")
        if sys.platform != "win32" and info.st_mode & 0o077 and not _kubernetes_secret(info):
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
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str, path: Path) -> TokenFile:
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
        return cls(entries)
