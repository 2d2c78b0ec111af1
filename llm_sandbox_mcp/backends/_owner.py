"""Who owns a sandbox: labels that tie every engine resource to one live server process."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping

from llm_sandbox_mcp.process_start import process_start

LABEL_PREFIX = "llm-sandbox-mcp"
MANAGED = f"{LABEL_PREFIX}.managed"
INSTANCE = f"{LABEL_PREFIX}.instance"
HOST = f"{LABEL_PREFIX}.host"
PID = f"{LABEL_PREFIX}.pid"
STARTED = f"{LABEL_PREFIX}.pid-start"
KIND = f"{LABEL_PREFIX}.kind"

INSTANCE_ID = uuid.uuid4().hex[:12]


def owner_labels(kind: str = "sandbox") -> dict[str, str]:
    pid = os.getpid()
    return {
        MANAGED: "true",
        INSTANCE: INSTANCE_ID,
        HOST: socket.gethostname(),
        PID: str(pid),
        STARTED: process_start(pid) or "",
        KIND: kind,
    }


def owner_is_gone(labels: Mapping[str, str]) -> bool:
    """True when the labels name a server process on this host that no longer runs.

    Resources of servers on other hosts are never judged dead: we cannot see their processes; nor are any where
    this system cannot tell when a process started (see `process_start`).
    """
    if labels.get(INSTANCE) == INSTANCE_ID:
        return False
    if labels.get(HOST) != socket.gethostname():
        return False
    try:
        pid = int(labels.get(PID, ""))
    except ValueError:
        return True
    started = process_start(pid)
    return started is not None and started != labels.get(STARTED)
