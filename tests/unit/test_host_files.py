"""Host files: only regular files below SANDBOX_HOST_DIRS, never executable, never replaced unasked, and no
answer that tells whether a path outside the allowed directories exists. (These tests run as root, as CI does:
making a device node needs it.)"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import anyio
import pytest

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import FileTransferError, InvalidRequest
from llm_sandbox_mcp.run.files import Files
from tests.support.fakes import FakeBackend

pytestmark = pytest.mark.anyio
POSIX_ONLY = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and executable bits are POSIX's")


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    directory = tmp_path / "allowed"
    directory.mkdir()
    return directory


@pytest.fixture
def files(allowed: Path) -> Files:
    return Files(Settings(sandbox_host_dirs=[str(allowed)], sandbox_max_file_size=1024), FakeBackend())


@POSIX_ONLY
async def test_a_fifo_is_refused_at_once_rather_than_waited_on(files: Files, allowed: Path) -> None:
    os.mkfifo(allowed / "pipe")
    with anyio.fail_after(10), pytest.raises(FileTransferError, match="not a regular file"):
        await files.read_host(str(allowed / "pipe"))
    with anyio.fail_after(10), pytest.raises(FileTransferError):
        await files.write_host(str(allowed / "pipe"), b"x", overwrite=True)


@pytest.mark.skipif(sys.platform != "linux", reason="makes a device node, which needs root (as Linux CI runs)")
async def test_a_device_is_refused(files: Files, allowed: Path) -> None:
    os.mknod(allowed / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(FileTransferError, match="not a regular file"):
        await files.read_host(str(allowed / "null"))


@POSIX_ONLY
async def test_an_existing_file_is_replaced_only_when_asked_and_never_made_executable(
    files: Files, allowed: Path
) -> None:
    target = allowed / "tool.sh"
    target.write_bytes(b"original")
    target.chmod(0o755)
    with pytest.raises(FileTransferError, match="overwrite"):
        await files.write_host(str(target), b"replaced")
    assert target.read_bytes() == b"original"
    await files.write_host(str(target), b"replaced", overwrite=True)
    assert target.read_bytes() == b"replaced"
    assert stat.S_IMODE(target.stat().st_mode) & 0o111 == 0
    fresh = await files.write_host(str(allowed / "new.bin"), b"\x7fELF")
    assert stat.S_IMODE((await anyio.Path(fresh).stat()).st_mode) & 0o111 == 0


async def test_outside_paths_get_one_answer_whether_they_exist_or_not(files: Files, tmp_path: Path) -> None:
    (tmp_path / "exists.txt").write_text("secret")
    answers: list[str] = []
    for path in (tmp_path / "exists.txt", tmp_path / "missing.txt", tmp_path / "missing" / "deeper.txt"):
        with pytest.raises(InvalidRequest) as raised:
            await files.read_host(str(path))
        answers.append(str(raised.value).replace(str(path), "PATH"))
        with pytest.raises(InvalidRequest) as written:
            await files.write_host(str(path), b"x")
        answers.append(str(written.value).replace(str(path), "PATH"))
    assert len(set(answers)) == 1, answers
    assert (tmp_path / "exists.txt").read_text() == "secret"


async def test_a_file_over_the_size_limit_is_refused(files: Files, allowed: Path) -> None:
    (allowed / "big.bin").write_bytes(b"x" * 2048)
    with pytest.raises(FileTransferError, match="SANDBOX_MAX_FILE_SIZE"):
        await files.read_host(str(allowed / "big.bin"))
