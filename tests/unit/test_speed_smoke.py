"""The CI speed smoke (benchmarks/smoke.py) decides by ratios to floors of the same run, against the newest full
result committed for each engine: its decision and where its baselines come from."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("speed_smoke", ROOT / "benchmarks" / "smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _table(folder: Path, name: str, backend: str, report: dict[str, Any], short: bool = False) -> None:
    result = {"benchmark": "table", "backend": backend, "short": short, "report": report}
    (folder / name).write_text(json.dumps(result))


def _report(print_ms: float, fork_ms: float, start_ms: float, import_ms: float) -> dict[str, Any]:
    return {
        "scenarios": {"python print(1)": {"back_to_back": {"p50_ms": 99.0}}},
        "zygote": {"scenarios": {"python print(1)": {"back_to_back": {"p50_ms": print_ms}}}},
        "floor_ms": {"fork of a warm interpreter": fork_ms},
        "start_to_tools_list_ms": start_ms,
        "start_floor_ms": {"import mcp.server (the official SDK)": import_ms},
    }


def test_the_baseline_is_the_newest_full_run_of_that_engine_and_the_zygote_s_call(tmp_path: Path) -> None:
    smoke = _smoke()
    _table(tmp_path, "2026-01-01-table-docker.json", "docker", _report(10, 2, 1000, 1000))
    _table(tmp_path, "2026-01-02-table-docker.json", "docker", _report(12, 3, 1100, 1000))
    _table(tmp_path, "2026-01-03-table-docker.json", "docker", _report(90, 1, 9000, 1000), short=True)
    _table(tmp_path, "2026-01-04-table-docker-on-podman.json", "podman", _report(90, 1, 9000, 1000))
    base = smoke.baseline("docker", tmp_path)
    assert (base.call, base.start) == (4.0, 1.1)
    assert "2026-01-02-table-docker.json" in base.source


def test_a_ratio_past_three_times_the_baseline_fails_and_one_within_it_passes() -> None:
    smoke = _smoke()
    base = smoke.Baseline(call=4.0, start=1.1, source="a full run")
    assert smoke.verdict("docker", 11.9, 3.2, base) == []
    failures = smoke.verdict("docker", 12.1, 3.4, base)
    assert len(failures) == 2
    assert "print(1)" in failures[0] and "12.1" in failures[0] and "a full run" in failures[0]
    assert "start-up" in failures[1]


def test_no_full_result_is_a_clear_error_not_a_pass(tmp_path: Path) -> None:
    smoke = _smoke()
    _table(tmp_path, "2026-01-01-table-docker.json", "docker", _report(10, 2, 1000, 1000), short=True)
    with pytest.raises(SystemExit, match="no full table result for docker"):
        smoke.baseline("docker", tmp_path)


@pytest.mark.parametrize("engine", ["bubblewrap", "docker"])
def test_the_committed_results_give_ci_a_baseline_for_each_engine_it_smokes(engine: str) -> None:
    base = _smoke().baseline(engine)
    assert base.call > 1 and base.start > 0.5
