"""What every container sandbox gets, whatever the engine (Docker, Podman, Kubernetes): its PID 1, the way
everything else in it is killed from outside, rlimits, cache names."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llm_sandbox_mcp.models import OOM_SCORE_ADJ, Limits

# PID 1, in every image that has a POSIX shell. It holds the sandbox open and:
# - is not dumpable (prctl PR_SET_DUMPABLE 0, set before anything else runs in the sandbox): no process of the
#   sandbox user can open its /proc/1/mem, read /proc/1/environ or ptrace it. The flag does not survive an
#   execve, so PID 1 is Perl itself (perl-base is in every Debian and Ubuntu image; the prctl number is per
#   architecture); an image without Perl gets the same loop in sh, dumpable;
# - reaps orphans (it waits for any child), so a fork bomb's zombies give their pids back;
# - on SIGUSR1 kills every other process of the sandbox user with one kill(-1). Nothing inside can stop or
#   dodge that: PID 1 of a PID namespace gets no signal from inside but those it handles (so no SIGSTOP or
#   SIGKILL), needs no new process (so a full pids limit does not matter), and kill(-1) reaches every
#   process at once. The engine sends the signal from outside;
# - ignores the signals it does not use (a shell handles SIGINT even as PID 1, and would end the sandbox with its
#   session): the code can send them; SIGUSR1, the kill, it can send too, and then kills only its own processes;
# - writes nothing: its output is /dev/null, so code writing to /proc/1/fd/1 cannot fill the engine's log;
# - always has one idle child, `sleep`, which it replaces once it ends: `kill_from_outside` watches for that;
# - continues (SIGCONT) every 0.2 s each stopped `runc init`: a process the engine starts in the sandbox (an
#   exec) runs as the sandbox user before it becomes the program asked for, and code that stops it there holds
#   every engine call on the container (the exec, the kill, the removal) until it goes on. PID 1 is the one
#   process of the sandbox user the code cannot stop.
_INIT_PERL = (
    "use POSIX; my %n = (x86_64 => 157, aarch64 => 167, armv7l => 172, ppc64le => 171, s390x => 172, "
    "riscv64 => 167); my $m = (POSIX::uname())[4]; syscall($n{$m}, 4, 0, 0, 0, 0) if exists $n{$m}; "
    "$SIG{$_} = 'IGNORE' for qw(INT TERM HUP QUIT USR2 ALRM PIPE); $SIG{USR1} = sub { kill 'KILL', -1 }; "
    "$SIG{CHLD} = sub {}; my $idle; while (1) { "
    "if (!$idle) { $idle = fork; if (defined $idle && !$idle) { exec 'sleep', '86400'; POSIX::_exit(127) } } "
    "select(undef, undef, undef, 0.2); "
    "while ((my $done = waitpid(-1, WNOHANG)) > 0) { $idle = undef if $idle && $done == $idle } "
    "opendir(my $proc, '/proc') or next; for my $pid (grep { /^[0-9]+$/ } readdir $proc) { "
    "open(my $stat, '<', \"/proc/$pid/stat\") or next; my $line = <$stat> // ''; "
    "kill 'CONT', $pid if $line =~ /^[0-9]+ [(]runc:[^)]*[)] T / } closedir $proc }"
)
INIT = [
    "sh",
    "-c",
    'exec </dev/null >/dev/null 2>&1; command -v perl >/dev/null && exec perl -e "$0"; '
    "trap '' INT TERM HUP QUIT USR2 ALRM PIPE; trap 'kill -KILL -1' USR1; "
    "while :; do sleep 86400 & wait $!; done",
    _INIT_PERL,
]
KILL_SIGNAL = "SIGUSR1"
# Where the engine cannot signal PID 1 (Kubernetes), a process of the sandbox asks it to, and is itself
# killed by it: exit status 137 proves the kill happened; anything else means it did not.
KILL_REQUEST = ["sh", "-c", "kill -USR1 1 && sleep 300"]
KILL_SECONDS = 30.0
CACHE_PREFIX = "llm-sandbox-mcp-libs-"
NPROC = 4096
# A zygote template container (`SandboxSpec.forks`) starts lower, and each call's sandbox raises itself back to
# OOM_SCORE_ADJ: a memory bomb kills the call, not the template that serves the next one.
TEMPLATE_OOM_SCORE_ADJ = 500


def oom_score_adj(forks: bool) -> int:
    return TEMPLATE_OOM_SCORE_ADJ if forks else OOM_SCORE_ADJ


Process = tuple[int, int, str]
"""pid, parent pid, command line, as an engine's `top` lists them."""


def top_processes(listing: Mapping[str, Any]) -> list[Process]:
    """The processes of an engine's `top` answer (`ps_args` pid,ppid,args)."""
    rows: list[list[str]] = listing.get("Processes") or []
    return [(int(row[0]), int(row[1]), str(row[2])) for row in rows]


def kill_from_outside(signal: Callable[[], None], top: Callable[[], list[Process]], engine_pid: int) -> bool:
    """Have PID 1 kill everything else, and wait until nothing but it and its idle child is left.

    `engine_pid` is PID 1 as the engine's inspection gives it. The idle child of the moment is noted first:
    PID 1 replaces it after killing, so a listing without it proves the kill ran. False when the sandbox did
    not get there within KILL_SECONDS.
    """
    listing = top()
    init_pid = _init_pid(listing, engine_pid)
    before = {pid for pid, parent, _ in listing if parent == init_pid}
    signal()
    deadline = time.monotonic() + KILL_SECONDS
    while time.monotonic() < deadline:
        others = [(pid, parent, command) for pid, parent, command in top() if pid != init_pid]
        if len(others) <= 1 and all(
            parent == init_pid and pid not in before and command.startswith("sleep") for pid, parent, command in others
        ):
            return True
        time.sleep(0.01)
    return False


def _init_pid(listing: Sequence[Process], engine_pid: int) -> int:
    """PID 1 as this `top` numbers it: the engine's host pid (Docker), or 1 (Podman lists namespace pids)."""
    return engine_pid if any(pid == engine_pid for pid, _, _ in listing) else 1


def rlimits(limits: Limits) -> dict[str, int]:
    """Resource limits set explicitly (soft = hard) on every sandbox.

    Engines' defaults can be higher than the host lets a container have (then the container does not start),
    so they are always given, and always lowered.
    """
    return {"nofile": limits.nofile, "nproc": NPROC, "core": 0}
