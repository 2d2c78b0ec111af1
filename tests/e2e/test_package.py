"""The package as it would be published: `uv build` gives a wheel and an sdist that pass `twine check`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomlkit

from llm_sandbox_mcp import __version__
from llm_sandbox_mcp.languages import LANGUAGES
from tests.e2e.test_stdio import SCRIPT

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the package"
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([uv, "build", "-q", "--out-dir", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    return out


def test_wheel_and_sdist_pass_twine_check(dist: Path) -> None:
    artifacts = sorted(dist.glob("llm_sandbox_mcp-*"))
    assert [path.name for path in artifacts] == [
        f"llm_sandbox_mcp-{__version__}-py3-none-any.whl",
        f"llm_sandbox_mcp-{__version__}.tar.gz",
    ]
    twine = Path(sys.executable).parent / "twine"
    checked = subprocess.run(
        [str(twine), "check", "--strict", *map(str, artifacts)], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wheel_carries_the_code_the_icon_and_the_packages_metadata(dist: Path) -> None:
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as wheel:
        names = set(wheel.namelist())
        info = f"llm_sandbox_mcp-{__version__}.dist-info"
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    shipped = {
        "icon.svg",
        "icon.png",
        "commands/install.py",
        "runners/PROTOCOL.md",
        "runners/python_kernel.py",
        "runners/javascript_runner.js",
    }
    # `images build` works from an installed package: every project image's Dockerfile and library list.
    shipped |= {f"images/{language}.Dockerfile" for language in LANGUAGES} | {"images/python.txt", "images/r.txt"}
    assert {f"llm_sandbox_mcp/{name}" for name in shipped} <= names
    project = tomlkit.parse((ROOT / "pyproject.toml").read_text()).unwrap()["project"]
    assert metadata["Version"] == __version__ and metadata["Summary"] == project["description"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "llm-sandbox-mcp = llm_sandbox_mcp.cli:main" in entry_points
    # On the package index a relative link leads nowhere: each points at the repository's file, which exists.
    links: list[str] = re.findall(r"\]\(([^)\s]+)\)", str(metadata.get_payload()))
    repository = project["urls"]["Source"] + "/blob/main/"
    assert links and all(re.match(r"[a-z][a-z0-9+.-]*:", link) for link in links), links
    ours = [link.removeprefix(repository) for link in links if link.startswith(repository)]
    assert ours and all((ROOT / path).is_file() for path in ours), ours


def test_the_sdist_can_rebuild_and_retest_the_package(dist: Path) -> None:
    with tarfile.open(next(dist.glob("*.tar.gz"))) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    expected = {"pyproject.toml", "server.json", "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "LICENSE"}
    assert expected | {"scripts/server_json.py", "tests/unit/test_server_json.py", "docs/configuration.md"} <= names


def test_the_installed_command_reports_its_version() -> None:
    shown = subprocess.run([SCRIPT, "--version"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == f"llm-sandbox-mcp {__version__}"
