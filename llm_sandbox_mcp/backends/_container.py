"""What every container sandbox gets, whatever the engine (Docker, Podman): its idle PID 1, rlimits, cache names."""

from __future__ import annotations

from llm_sandbox_mcp.models import Limits

# PID 1. No init process: a PID-namespace init ignores signals from inside, so `kill -9 -1` on timeout kills
# everything but it, and the sandbox stays usable; an init such as tini would exit with its killed child.
SLEEPER = ["sleep", "infinity"]
# Run as the sandbox user: kills every process of that user in the sandbox, except PID 1 and itself.
KILL_ALL = ["sh", "-c", "kill -9 -1"]
CACHE_PREFIX = "llm-sandbox-mcp-libs-"
NPROC = 4096


def rlimits(limits: Limits) -> dict[str, int]:
    """Resource limits set explicitly (soft = hard) on every sandbox.

    Engines' defaults can be higher than the host lets a container have (then the container does not start),
    so they are always given, and always lowered.
    """
    return {"nofile": limits.nofile, "nproc": NPROC, "core": 0}
