"""What the daemonless engines need from the host besides their jail program: the PATH of their host-side
helpers, and private directories for their state and library caches (user namespaces: `_userns`).

All functions block; the backends call them from worker threads.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from llm_sandbox_mcp.cache_index import cache_home
from llm_sandbox_mcp.errors import BackendUnavailable

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def private_dir(path: Path, mode: int) -> Path:
    """Create (or check) a directory only we own and only we may write: /tmp is shared with everyone."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise BackendUnavailable(f"{path} is not a private directory owned by this user; remove it and retry")
    os.chmod(path, mode)
    return path


def state_root() -> Path:
    """Small per-server bookkeeping (ownership labels, a staged bwrap): runtime dir, else the temp dir."""
    if os.geteuid() == 0:
        # Traversable (not listable) by the unprivileged uid the sandboxes run as, for a staged bwrap.
        base = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
        return private_dir(base / "llm-sandbox-mcp", 0o711)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return private_dir(Path(runtime) / "llm-sandbox-mcp", 0o700)
    return private_dir(Path(tempfile.gettempdir()) / f"llm-sandbox-mcp-{os.geteuid()}", 0o700)


def cache_root() -> Path:
    """Library caches, beside the index of them (see `cache_index.cache_home`)."""
    return cache_home() / "libs"
