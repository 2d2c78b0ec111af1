"""The parallel tiers (scripts/test) keep engines that share host state on one worker through pytest-xdist's
`--dist loadgroup` and groups added at collection, as tests/engines/conftest.py adds them. pytest 9.2 broke that
silently (pytest-dev/pytest-xdist#1386): this fails if a pytest or xdist release breaks it again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group("shared-host-state"))
"""

TESTS = """
import os
import pytest

@pytest.mark.parametrize("n", range(6))
def test_records_its_worker(n, tmp_path_factory):
    with open(os.environ["WORKERS_FILE"], "a") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_tests_grouped_at_collection_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent(TESTS))
    workers = tmp_path / "workers"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-c",
         "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "WORKERS_FILE": str(workers)},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    seen = workers.read_text().split()
    assert len(seen) == 6 and len(set(seen)) == 1, seen
