"""The hostile tier runs on every real engine, with the engine tier's fixtures, and after every attack proves
the host unharmed: no process of the sandbox user left on the host, and no growth of the server's memory or
the host's disk beyond a small margin."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_sandbox_mcp.models import Limits
from tests.engines.conftest import backend as backend
from tests.engines.conftest import engine as engine
from tests.engines.conftest import executor as executor
from tests.engines.conftest import kube_double_stopped as kube_double_stopped
from tests.engines.conftest import pytest_collection_modifyitems as pytest_collection_modifyitems
from tests.engines.conftest import registry as registry
from tests.support.memory import RssWindow

_MARGIN = 256 * 1024**2
_SETTLE_SECONDS = 30.0


def sandbox_user_processes() -> list[str]:
    """Live host processes of the sandbox user (every engine runs sandboxes as that uid on this host)."""
    found: list[str] = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        uid = fields.get("Uid", "").split()
        if uid and int(uid[0]) == Limits().uid and not fields.get("State", "").strip().startswith("Z"):
            found.append(f"{status.parent.name} {fields.get('Name', '').strip()}")
    return found


@pytest.fixture(autouse=True)
def host_unharmed(engine: str) -> Iterator[None]:
    """Set up before the sandboxes and torn down after them, so it sees what the attack left behind (processes
    of the sandbox user that other tests left running before this one are not its concern)."""
    rss, free, before = RssWindow(), shutil.disk_usage("/").free, set(sandbox_user_processes())
    yield

    def left() -> list[str]:
        return [process for process in sandbox_user_processes() if process not in before]

    deadline = time.monotonic() + _SETTLE_SECONDS  # the Kubernetes double removes containers in the background
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == [], f"processes of the sandbox user outlived the {engine} sandboxes"
    assert rss.growth() < _MARGIN, "the server's memory grew past the margin (its peak during this test)"
    assert free - shutil.disk_usage("/").free < _MARGIN, "the host's disk filled past the margin"
