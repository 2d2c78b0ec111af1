"""What the server needs from the operating system on every platform: a lock between processes (the library cache
index) and a process's start time (whether the server that made a sandbox still runs).

These run wherever the unit tier runs (Linux here; macOS and Windows in the platforms workflow), so each
platform's implementation is exercised by the same tests; the zombie case is Linux's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llm_sandbox_mcp.backends import _owner
from llm_sandbox_mcp.file_lock import locked
from llm_sandbox_mcp.process_start import process_start

_HOLDER = """
import sys, time
from pathlib import Path
from llm_sandbox_mcp.file_lock import locked
print("locking", flush=True)
with locked(Path(sys.argv[1])):
    print("locked", flush=True)
    if sys.argv[2] == "hold":
        time.sleep(600)
"""


def _python(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *args], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )


def test_a_second_process_waits_for_the_lock_and_gets_it_once_released(tmp_path: Path) -> None:
    lock = tmp_path / "index.lock"
    with _python(str(lock), "release") as waiter:
        assert waiter.stdout is not None
        with locked(lock):
            assert waiter.stdout.readline() == "locking\n"
            with pytest.raises(subprocess.TimeoutExpired):
                waiter.wait(timeout=1)  # blocked on our lock
        assert waiter.stdout.readline() == "locked\n"
        assert waiter.wait(timeout=60) == 0


def test_a_lock_whose_holder_was_killed_is_free(tmp_path: Path) -> None:
    lock = tmp_path / "index.lock"
    with _python(str(lock), "hold") as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locking\n"
        assert holder.stdout.readline() == "locked\n"
        holder.kill()
        holder.wait(timeout=60)
    taken = threading.Event()

    def take() -> None:
        with locked(lock):
            taken.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert taken.is_set()


def test_a_lock_leaves_the_file_it_guards_alone(tmp_path: Path) -> None:
    lock = tmp_path / "index.lock"
    lock.write_bytes(b"kept")
    with locked(lock):
        pass
    with locked(lock):
        pass
    assert lock.read_bytes() == b"kept"


def test_a_live_process_has_one_start_time_and_an_ended_one_none() -> None:
    own = process_start(os.getpid())
    assert own is not None and own.isdigit()
    assert process_start(os.getpid()) == own
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = process_start(child.pid)
        assert started is not None and started.isdigit()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
    assert process_start(child.pid) == ""


@pytest.mark.skipif(sys.platform != "linux", reason="waits for a child without reaping it: os.waitid, Linux's")
def test_a_zombie_counts_as_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    try:
        assert process_start(child.pid) == ""
    finally:
        child.wait(timeout=60)


def _labels(pid: int, started: str | None, host: str | None = None) -> dict[str, str]:
    return {
        _owner.MANAGED: "true",
        _owner.INSTANCE: "another-server",
        _owner.HOST: host or socket.gethostname(),
        _owner.PID: str(pid),
        _owner.STARTED: started or "",
    }


def test_an_owner_is_gone_only_when_its_process_ended_or_its_pid_went_to_another() -> None:
    assert not _owner.owner_is_gone(_owner.owner_labels())
    assert not _owner.owner_is_gone(_labels(os.getpid(), process_start(os.getpid())))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)
    assert _owner.owner_is_gone(_labels(ended.pid, "1"))
    assert _owner.owner_is_gone(_labels(os.getpid(), "1"))  # our pid, but another process's start
    assert not _owner.owner_is_gone(_labels(ended.pid, "1", host="another-host"))


def test_where_the_system_cannot_tell_no_owner_is_judged_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)
    monkeypatch.setattr(sys, "platform", "sunos5")
    assert process_start(ended.pid) is None
    assert not _owner.owner_is_gone(_labels(ended.pid, "1"))
    assert _owner.owner_labels()[_owner.STARTED] == ""
