"""Sessions and files on real engines: state, isolation, interrupts, and paths that try to escape."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from llm_sandbox_mcp.errors import FileTransferError, InvalidRequest, SandboxError
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.files import Files
from llm_sandbox_mcp.run.sessions import Session, SessionRegistry
from tests.engines.conftest import RecordingBackend, engine_settings

pytestmark = pytest.mark.anyio


async def cell(registry: SessionRegistry, session: Session, code: str, timeout: float = 30) -> tuple[str, str]:
    result = await registry.execute(session.id, code, [], timeout)
    return result.stdout, result.stderr


async def test_python_state_survives_between_calls_like_a_notebook(registry: SessionRegistry) -> None:
    session = await registry.create("python", [])
    assert await cell(registry, session, "import math\nx = 41\ndef double(v):\n    return 2 * v") == ("", "")
    assert await cell(registry, session, "x + 1") == ("42\n", "")
    assert (await cell(registry, session, "print(double(x)); math.pi"))[0] == "82\n3.141592653589793\n"
    failing = await registry.execute(session.id, "y = 1\nraise KeyError('k')", [], 30)
    assert failing.exit_code == 1 and "KeyError: 'k'" in failing.stderr and '<cell 4>", line 2' in failing.stderr
    assert await cell(registry, session, "y") == ("1\n", "")


async def test_every_figure_of_a_cell_comes_back(registry: SessionRegistry) -> None:
    session = await registry.create("python", [])
    result = await registry.execute(
        session.id,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\nplt.figure(); plt.plot([2, 1])",
        [],
        60,
    )
    assert [a.mime_type for a in result.artifacts] == ["image/png", "image/png"]
    again = await registry.execute(session.id, "plt.figure(); plt.plot([3, 3])", [], 60)
    assert len(again.artifacts) == 1  # only what this cell made


async def test_two_sessions_are_isolated(registry: SessionRegistry) -> None:
    first = await registry.create("python", [])
    second = await registry.create("python", [])
    await cell(registry, first, "secret = 'alpha'\nopen('/workspace/secret.txt', 'w').write('alpha')")
    out, err = await cell(registry, second, "import os\nprint('secret' in globals(), os.path.exists('secret.txt'))")
    assert (out, err) == ("False False\n", "")


async def test_a_cell_that_times_out_is_interrupted_and_the_session_survives(registry: SessionRegistry) -> None:
    session = await registry.create("python", [])
    await cell(registry, session, "kept = 'yes'")
    result = await registry.execute(
        session.id, "import time\nprint('working', flush=True)\nwhile True: time.sleep(0.01)", [], 2
    )
    assert result.timed_out and not result.interpreter_lost
    assert result.stdout == "working\n" and "KeyboardInterrupt" in result.stderr
    assert await cell(registry, session, "kept") == ("'yes'\n", "")


async def test_a_cell_that_ignores_interrupts_is_killed_and_the_session_restarts(registry: SessionRegistry) -> None:
    session = await registry.create("python", [])
    await cell(registry, session, "lost = 1\nopen('kept.txt', 'w').write('file survives')")
    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.01)"
    result = await registry.execute(session.id, stubborn, [], 2)
    assert result.timed_out and result.interpreter_lost
    after = await registry.execute(session.id, "print(open('kept.txt').read()); print('lost' in globals())", [], 30)
    assert after.stdout == "file survives\nFalse\n"
    assert "restarted" in after.stderr


async def test_files_round_trip_and_list(registry: SessionRegistry, executor: Executor) -> None:
    session = await registry.create("python", [])
    files = Files(executor.settings, executor.backend)
    blob = bytes(range(256)) * 64
    await files.upload(session.lease.ref, "data/blob.bin", blob)
    await files.upload(session.lease.ref, "notes.txt", "héllo\n".encode())
    assert await files.download(session.lease.ref, "data/blob.bin") == blob
    out, _ = await cell(registry, session, "print(len(open('data/blob.bin', 'rb').read()), open('notes.txt').read())")
    assert out == "16384 héllo\n\n"
    listing = {(e.path, e.type, e.size) for e in await files.list(session.lease.ref)}
    assert (
        ("data/blob.bin", "file", 16384) in listing
        and ("data", "directory", listing and 4096) in listing
        or any(entry[0] == "data" and entry[1] == "directory" for entry in listing)
    )
    assert ("notes.txt", "file", 7) in listing


async def test_symlinks_planted_by_the_code_cannot_redirect_file_tools(
    registry: SessionRegistry, executor: Executor
) -> None:
    session = await registry.create("python", [])
    files = Files(executor.settings, executor.backend)
    await cell(registry, session, "import os\nos.symlink('/etc', 'etc_link')\nos.symlink('/tmp/x', 'file_link')")
    with pytest.raises(FileTransferError, match="leaves the workspace"):
        await files.download(session.lease.ref, "etc_link/passwd")
    with pytest.raises(FileTransferError, match="leaves the workspace"):
        await files.upload(session.lease.ref, "etc_link/evil", b"x")
    with pytest.raises(FileTransferError):
        await files.upload(session.lease.ref, "file_link", b"x")
    out, _ = await cell(registry, session, "import os\nprint(os.path.exists('/tmp/x'))")
    assert out == "False\n"


async def test_devices_and_oversized_files_are_refused(registry: SessionRegistry, executor: Executor) -> None:
    settings = executor.settings.model_copy(update={"sandbox_max_file_size": 1024})
    session = await registry.create("python", [])
    files = Files(settings, executor.backend)
    with pytest.raises(FileTransferError, match="SANDBOX_MAX_FILE_SIZE"):
        await files.upload(session.lease.ref, "big.bin", b"x" * 2048)
    await cell(
        registry, session, "open('big.bin', 'wb').write(b'x' * 4096)\nimport os\nos.symlink('/dev/zero', 'zero')"
    )
    with pytest.raises(FileTransferError, match="too large"):
        await files.download(session.lease.ref, "big.bin")
    with pytest.raises(FileTransferError):
        await files.download(session.lease.ref, "dev")


async def test_host_copies_stay_below_the_allowed_directories(
    registry: SessionRegistry, executor: Executor, tmp_path: Path
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "input.csv").write_text("a,b\n1,2\n")
    (allowed / "escape").symlink_to("/etc/passwd")
    (tmp_path / "outside.txt").write_text("no")
    settings = executor.settings.model_copy(update={"sandbox_host_dirs": [str(allowed)]})
    files = Files(settings, executor.backend)
    session = await registry.create("python", [])
    data = await files.read_host(str(allowed / "input.csv"))
    await files.upload(session.lease.ref, "input.csv", data)
    await cell(registry, session, "open('result.txt', 'w').write(open('input.csv').read().upper())")
    written = await files.write_host(str(allowed / "result.txt"), await files.download(session.lease.ref, "result.txt"))
    assert await anyio.Path(written).read_text() == "A,B\n1,2\n"
    for bad in (str(tmp_path / "outside.txt"), str(allowed / "escape"), str(allowed / ".." / "outside.txt"), "rel"):
        with pytest.raises(SandboxError):
            await files.read_host(bad)
    with pytest.raises(SandboxError):
        await files.write_host(str(allowed / "escape"), b"overwrite passwd?")
    with pytest.raises(SandboxError):
        await files.write_host(str(tmp_path / "new.txt"), b"outside")
    assert not (tmp_path / "new.txt").exists()
    assert await anyio.Path("/etc/passwd").read_bytes() != b"overwrite passwd?"


async def test_sessions_end_with_the_server(backend: RecordingBackend, engine: str) -> None:
    async with Executor(engine_settings(engine), backend) as executor:
        registry = SessionRegistry(executor.settings, executor)
        session = await registry.create("python", [])
        ref = session.lease.ref
        await registry.aclose()
    with pytest.raises(SandboxError):
        await backend.exec(ref, ["true"], timeout=10)


async def test_a_session_must_not_ask_for_more_than_the_operator_allows(registry: SessionRegistry) -> None:
    with pytest.raises(InvalidRequest, match="SANDBOX_SESSION_MAX_MEMORY"):
        await registry.create("python", [], memory="64g")


async def test_files_persist_between_calls_in_other_languages(registry: SessionRegistry) -> None:
    session = await registry.create("javascript", [])
    first = await registry.execute(
        session.id, "require('fs').writeFileSync('state.txt', 'kept'); console.log('wrote')", [], 60
    )
    assert (first.exit_code, first.stdout) == (0, "wrote\n"), first.stderr
    second = await registry.execute(session.id, "console.log(require('fs').readFileSync('state.txt', 'utf8'))", [], 60)
    assert second.stdout == "kept\n"
    assert second.session_id == session.id


async def test_list_sessions_reports_what_a_session_uses(registry: SessionRegistry, engine: str) -> None:
    session = await registry.create("python", [])
    await cell(registry, session, "open('blob.bin', 'wb').write(b'x' * 300_000)")
    usage = await registry.usage(session)
    assert usage["workspace_bytes"] is not None and usage["workspace_bytes"] >= 300_000
    if engine == "docker":
        assert usage["memory_bytes"] is not None and usage["memory_bytes"] > 0
