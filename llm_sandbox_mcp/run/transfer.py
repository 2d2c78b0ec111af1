"""Files in and out of a sandbox as tar streams, read defensively: the sandbox's side is untrusted."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import PurePosixPath

from llm_sandbox_mcp.errors import FileTransferError


def safe_relative(path: str) -> PurePosixPath:
    """A normalised relative path that cannot leave its directory; raises FileTransferError otherwise."""
    if not path or "\x00" in path:
        raise FileTransferError(f"Invalid path {path!r}")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise FileTransferError(f"Path {path!r} is absolute; use a path relative to the workspace")
    parts = [part for part in pure.parts if part not in ("", ".")]
    if not parts or ".." in parts:
        raise FileTransferError(f"Path {path!r} leaves the workspace")
    return PurePosixPath(*parts)


def pack(files: Mapping[str, bytes], uid: int, gid: int) -> bytes:
    """A tar archive of regular files owned by the sandbox user."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(str(safe_relative(name)))
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, uid, gid
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack(data: bytes, max_files: int = 1000) -> dict[PurePosixPath, bytes]:
    """Regular files from a tar stream a sandbox produced, which is hostile input.

    Only plain regular members are read; links, devices, FIFOs and sparse members (which would expand to
    whatever size their map claims) are skipped, never followed or expanded, and paths that escape are
    skipped. What is returned was really read from `data`: never more bytes than the archive holds.
    """
    files: dict[PurePosixPath, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.sparse is not None:
                    continue
                try:
                    name = safe_relative(member.name)
                except FileTransferError:
                    continue
                handle = archive.extractfile(member)
                if handle is not None:
                    files[name] = handle.read(len(data))
                if len(files) >= max_files:
                    break
    except tarfile.TarError as exc:
        raise FileTransferError(f"The sandbox returned an unreadable archive: {exc}") from exc
    return files
