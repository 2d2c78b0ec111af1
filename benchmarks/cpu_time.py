"""CPU time per call, by whose it is: what bounds calls per second once every core is busy.

Back to back and in parallel, a call's wall time is at most what the machine's cores can give it: a call that
costs 20 ms of CPU in all (the client, the server, the sandbox's processes and the kernel's work for them) can
run at most `cores × 1000 / 20` times a second, whatever the concurrency. `CpuAccount` reads the machine's busy
time (/proc/stat, every core; idle, I/O wait and time stolen by the hypervisor are not busy) and the server's
and this client's own CPU time around a series of calls; the rest is the sandboxes, the engine and the
kernel's threads. The machine's background (measured over a second before the calls) is taken off, and work a
call leaves behind (a cgroup removed, an exit finished) is counted for a second after the last one. Linux only.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_SECONDS = 1.0


def busy_seconds() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (all cores)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / TICKS


def process_seconds(pid: int) -> float:
    """User and system CPU seconds of a process (all its threads, none of its children); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_named(word: str) -> int | None:
    """The pid of this process's child whose command line has `word` (the server the client spawned)."""
    me = str(os.getpid())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii") as handle:
                parent = handle.read().rpartition(")")[2].split()[1]
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:
            continue
        if parent == me and word.encode() in command:
            return int(name)
    return None


@dataclass
class CpuAccount:
    """Milliseconds of CPU per call: all of it, the server process's, this client's, and the rest."""

    calls: int
    total_ms: float
    server_ms: float
    client_ms: float
    background_ms_per_s: float

    @property
    def rest_ms(self) -> float:
        return self.total_ms - self.server_ms - self.client_ms

    def as_dict(self, cores: int) -> dict[str, float]:
        per_call = max(self.total_ms, 0.01)
        return {
            "calls": self.calls,
            "total_ms": round(self.total_ms, 2),
            "server_ms": round(self.server_ms, 2),
            "client_ms": round(self.client_ms, 2),
            "sandboxes_engine_kernel_ms": round(self.rest_ms, 2),
            "background_ms_per_s": round(self.background_ms_per_s, 1),
            "ceiling_calls_per_s": round(cores * 1000 / per_call, 1),
        }


async def account(server_pid: int, calls: int, run: Callable[[], Awaitable[None]]) -> CpuAccount:
    """Run `run` (an async callable making `calls` calls) and account for the CPU they took."""
    start = busy_seconds()
    await anyio.sleep(SETTLE_SECONDS)
    background = (busy_seconds() - start) / SETTLE_SECONDS
    machine, server, client = busy_seconds(), process_seconds(server_pid), own_seconds()
    began = time.perf_counter()
    await run()
    server_after, client_after = process_seconds(server_pid), own_seconds()
    await anyio.sleep(SETTLE_SECONDS)
    elapsed = time.perf_counter() - began
    spent = busy_seconds() - machine - background * elapsed
    return CpuAccount(
        calls=calls,
        total_ms=spent * 1000 / calls,
        server_ms=(server_after - server) * 1000 / calls,
        client_ms=(client_after - client) * 1000 / calls,
        background_ms_per_s=background * 1000,
    )
