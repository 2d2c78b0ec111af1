from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from llm_sandbox_mcp.errors import FileTransferError
from llm_sandbox_mcp.models import HeadTail
from llm_sandbox_mcp.run.transfer import pack, safe_relative, unpack


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "", ".", "a/\x00b"])
def test_paths_that_leave_the_workspace_are_refused(path: str) -> None:
    with pytest.raises(FileTransferError):
        safe_relative(path)


def test_relative_paths_are_normalised() -> None:
    assert safe_relative("./a//b/c.txt") == PurePosixPath("a/b/c.txt")


def _hostile_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:

        def add(info: tarfile.TarInfo, data: bytes = b"") -> None:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))

        add(tarfile.TarInfo("./good.txt"), b"fine")
        add(tarfile.TarInfo("../escape.txt"), b"bad")
        add(tarfile.TarInfo("/abs.txt"), b"bad")
        link = tarfile.TarInfo("passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        add(link)
        hard = tarfile.TarInfo("hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/shadow"
        add(hard)
        device = tarfile.TarInfo("null")
        device.type = tarfile.CHRTYPE
        add(device)
    return buffer.getvalue()


def test_unpack_keeps_only_regular_files_inside() -> None:
    assert unpack(_hostile_tar()) == {PurePosixPath("good.txt"): b"fine"}


def test_unpack_of_garbage_is_a_clear_error() -> None:
    with pytest.raises(FileTransferError, match="unreadable archive"):
        unpack(b"\xff" * 1024)


def test_pack_round_trips_binary() -> None:
    data = bytes(range(256)) * 10
    assert unpack(pack({"dir/blob.bin": data}, 65534, 65534)) == {PurePosixPath("dir/blob.bin"): data}


def test_head_tail_memory_stays_bounded_and_keeps_both_ends() -> None:
    capture = HeadTail(100)
    capture.feed(b"START")
    for _ in range(10_000):
        capture.feed(b"x" * 1000)
    capture.feed(b"END")
    value = capture.getvalue()
    assert capture.truncated
    assert value.startswith(b"START") and value.endswith(b"END")
    assert len(value) < 200
    assert b"[... 9999908 bytes truncated ...]" in value


@pytest.mark.skipif(sys.platform != "linux", reason="makes the archives with GNU tar, which Linux has")
@pytest.mark.parametrize("sparse_format", ["--format=gnu", "--format=posix"])
def test_a_sparse_member_is_never_expanded(tmp_path: Path, sparse_format: str) -> None:
    """GNU and PAX sparse members say how large they are when expanded; a 1 GiB hole costs a few bytes to send."""
    (tmp_path / "hole.png").write_bytes(b"")
    os.truncate(tmp_path / "hole.png", 1 << 30)
    (tmp_path / "plain.txt").write_bytes(b"kept")
    archive = subprocess.run(
        ["tar", "--sparse", sparse_format, "-c", "-C", str(tmp_path), "hole.png", "plain.txt"],
        capture_output=True,
        check=True,
    ).stdout
    assert len(archive) < 64 * 1024
    assert unpack(archive) == {PurePosixPath("plain.txt"): b"kept"}
