"""A host asked for at run time, proven from inside real sandboxes: unreachable before, reachable after the
person accepts, still unreachable after a decline, and never reachable from another session; the call that
was refused says so in its result."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import cast

import pytest

from llm_sandbox_mcp.run.sessions import SessionRegistry
from tests.engines.test_egress import FETCH, _executor  # pyright: ignore[reportPrivateUsage]
from tests.support.egress import loopback_name
from tests.support.registries import serve

pytestmark = pytest.mark.anyio


# One engine of each way a sandbox reaches the proxy (container exec stream, a host process, the Kubernetes
# double's exec); the session's proxy and its widening are the same code on all of them.
@pytest.mark.parametrize(
    "engine", [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("docker", "bubblewrap", "kubernetes")]
)
async def test_a_host_asked_for_opens_to_that_session_only_and_only_when_accepted(
    request: pytest.FixtureRequest, engine: str
) -> None:
    name, address = loopback_name()
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-asked-") as tmp, serve(Path(tmp), address, name) as url:
        (Path(tmp) / "data").write_text("ok")
        host = url.removeprefix("http://")
        code = FETCH.format(allowed=f"{url}/data", unlisted=f"{url}/data")
        async with _executor(request, engine, set(), sandbox_session_allow_hosts=[host]) as executor:
            sessions = SessionRegistry(executor.settings, executor)
            try:
                asking = await sessions.create("python", [], network=[])
                other = await sessions.create("python", [], network=[])
                before = await sessions.execute(asking.id, code, [], 60)
                granted = await sessions.request_network(asking.id, host, "to read the data", "accept")
                after = await sessions.execute(asking.id, code, [], 60)
                elsewhere = await sessions.execute(other.id, code, [], 60)
                declined = await sessions.request_network(other.id, host, "to read it too", "decline")
                still = await sessions.execute(other.id, code, [], 60)
                described = sessions.get(asking.id).describe()
            finally:
                await sessions.aclose()
    assert before.stdout == "403 403\n", before.stderr
    assert before.network_refused == [
        f"{host} refused: a host not on this sandbox's allowlist; request_network can ask the person for it"
    ]
    assert granted.outcome == "granted" and declined.outcome == "declined"
    assert after.stdout == "200 200\n" and after.network_refused == [], after.stderr
    assert elsewhere.stdout == still.stdout == "403 403\n", (elsewhere.stderr, still.stderr)
    assert described["allowed_hosts"] == [host]
    decisions = cast("list[str]", described["network_requests"])
    assert len(decisions) == 1 and decisions[0].endswith(f" granted {host} (reason: to read the data)")
