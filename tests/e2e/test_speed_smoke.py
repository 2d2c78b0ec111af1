"""The speed smoke, run as CI's guard against a 3x regression (benchmarks/smoke.py decides; its decision is
tested in tests/unit/test_speed_smoke.py): the installed server on bubblewrap and Docker, over stdio."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = os.environ.get("LLM_SANDBOX_MCP_COMMAND") or str(Path(sys.executable).parent / "llm-sandbox-mcp")


def test_calls_and_start_up_are_within_three_times_their_measured_ratio_to_the_floor() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "smoke.py"), "--command", SCRIPT],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    report = [line for line in done.stderr.splitlines() if line.startswith(("smoke ", "REGRESSION "))]
    sys.stderr.write("\n".join(report) + "\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split(":")[0] for line in report] == ["smoke bubblewrap", "smoke docker"], done.stderr[-3000:]
