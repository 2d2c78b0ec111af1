"""Session and job ids: random, and naming the server replica that issued them (`s-<hex>.<replica>`), so that
any replica can tell which one holds a session or a job (`server/forwarding.py` sends the call there).

Without a replica id (stdio, or one HTTP replica) an id is the random part alone, as before.
"""

from __future__ import annotations

import re
import secrets

# A DNS label (a StatefulSet pod's name is one), short enough that the longest id stays within 64 characters.
REPLICA = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
SEPARATOR = "."


def new_id(kind: str, random_bytes: int, replica: str | None) -> str:
    """`kind-<hex>`, with `.replica` after it when the server is one of several replicas."""
    random = f"{kind}-{secrets.token_hex(random_bytes)}"
    return f"{random}{SEPARATOR}{replica}" if replica else random


def replica_of(identifier: str) -> str | None:
    """The replica an id names, or None (an id of a server without replicas, or not one of ours at all)."""
    _, separator, replica = identifier.partition(SEPARATOR)
    return replica if separator and REPLICA.fullmatch(replica) else None
