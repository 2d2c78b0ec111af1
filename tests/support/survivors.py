"""What is left running in a sandbox after a kill, by command line: a call's processes told apart from what
holds the sandbox (PID 1 and its idle sleeper in a container, which PID 1 starts again up to 0.2 s after a kill;
the holder's shell and sleep on bubblewrap and NsJail) and from the listing itself."""

from __future__ import annotations

# Every live process's command line, one a line (zombies are dead); run as the backend's own exec.
LISTING = "for p in /proc/[0-9]*; do grep -q 'State:.*Z' $p/status || { tr '\\0' ' ' < $p/cmdline; echo; }; done"
_HOLDING = ("perl -e ", "sh -c exec </dev/null", "sleep 86400", "/bin/sh -c echo; while :; do sleep 3600", "sleep 3600")


def survivors(listing: bytes) -> list[str]:
    """The command lines in `listing`'s output that are neither the sandbox's holders nor the listing's own
    processes (its shell, and on bubblewrap the bwrap that launched it)."""
    lines = [line.strip() for line in listing.decode(errors="replace").splitlines() if line.strip()]
    assert any(line.startswith("sh -c for p in") for line in lines), lines  # the listing saw itself: not blind
    return [
        line
        for line in lines
        if not line.startswith(("sh -c for p in", "cat ", "grep ", "tr "))
        and line.split(" ", 1)[0].rsplit("/", 1)[-1] != "bwrap"
        and not any(line.startswith(holder) for holder in _HOLDING)
    ]
