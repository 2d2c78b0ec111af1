"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, its server scenarios) against
`serve --http` on loopback, the installed console script on bubblewrap, with the baseline of the scenarios this
server fails and why (tests/e2e/conformance-baseline.yml). `scripts/conformance-tools` installs the suite and
Node 22 once, into tests/e2e/.conformance.

About 15 s here the first time (the npm install), then about 5 s (the server's start and 30 scenarios of the
suite in 2 s): worth it as the only check of the protocol by an implementation other than the SDK's own.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx2
import pytest

from tests.e2e.test_http import _environment, _free_port  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_stdio import SCRIPT
from tests.engines.conftest import require_now

pytestmark = [pytest.mark.e2e, pytest.mark.bubblewrap]

ROOT = Path(__file__).parents[2]
BASELINE = Path(__file__).parent / "conformance-baseline.yml"
# Scenarios that must pass: the protocol's core as this server serves it.
MUST_PASS = ("server-initialize", "ping", "tools-list", "tools-call-error", "dns-rebinding-protection")


def test_the_conformance_suite_passes_but_for_its_baseline(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    require_now(request, "bubblewrap")
    suite = subprocess.run(
        [ROOT / "scripts" / "conformance-tools"], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    port = _free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as err:
        server = subprocess.Popen(
            [SCRIPT, "serve", "--http", f"127.0.0.1:{port}", "--allow-unauthenticated-loopback"],
            env=_environment(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        run = subprocess.run(
            [*suite, "server", "--url", url, "--expected-failures", str(BASELINE), "-o", str(tmp_path / "results")],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    summary = run.stdout[run.stdout.rfind("=== SUMMARY ===") :]
    assert run.returncode == 0, summary or run.stdout[-3000:] + run.stderr[-3000:]
    for scenario in MUST_PASS:
        assert f"✓ {scenario}:" in summary, summary
