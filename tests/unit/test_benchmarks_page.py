"""docs/benchmarks.md is what benchmarks/render.py makes of the committed result files, and those files say
where and when their numbers were measured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "measured"


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "benchmarks" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(date: str, report: dict[str, Any], backend: str = "docker") -> dict[str, Any]:
    machine = {"cpu": "Test CPU", "cores": 2, "memory_gib": 4.0, "kernel": "Linux 6.1", "engines": {"docker": "26"}}
    return {"benchmark": "table", "backend": backend, "date": date, "machine": machine, "report": report}


def test_the_page_is_what_the_result_files_make() -> None:
    render = _renderer()
    expected = render.render(render.load(RESULTS))
    assert (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8") == expected, (
        "docs/benchmarks.md is out of date: run python benchmarks/render.py"
    )


def test_every_result_file_names_its_machine_date_and_benchmark() -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files
    for path in files:
        result = json.loads(path.read_text(encoding="utf-8"))
        assert {"benchmark", "backend", "date", "machine", "report", "source"} <= set(result), path.name
        assert result["date"][:4].isdigit() and result["machine"].get("cores"), path.name


def test_a_row_measured_again_is_shown_only_from_the_newer_run() -> None:
    render = _renderer()
    floor = {"fork of a warm interpreter": 3.0}
    old = _result(
        "2026-01-01T00:00:00Z",
        {
            "scenarios": {
                "python print(1)": {"paced": {"p50_ms": 111, "p95_ms": 112}, "back_to_back": {"p50_ms": 113}},
                "ruby hello": {"paced": {"p50_ms": 121, "p95_ms": 122}, "back_to_back": {"p50_ms": 123}},
            },
            "floor_ms": floor,
        },
    )
    new = _result(
        "2026-02-01T00:00:00Z",
        {
            "scenarios": {
                "python print(1)": {"paced": {"p50_ms": 211, "p95_ms": 212}, "back_to_back": {"p50_ms": 213}}
            },
            "floor_ms": {"fork of a warm interpreter": 4.5},
        },
    )
    gone = _result("2025-12-01T00:00:00Z", {"scenarios": {"ruby hello": {"paced": {"p50_ms": 777}}}})
    smoke = {
        **_result("2026-03-01T00:00:00Z", {"scenarios": {"ruby hello": {"paced": {"p50_ms": 888}}}}),
        "short": True,
    }
    page = render.render([gone, old, new, smoke])
    assert "| python print(1) | 211 / 212 ms | 213 / — ms |" in page
    assert "111" not in page and "777" not in page and "2025-12-01" not in page
    assert "| ruby hello | 121 / 122 ms | 123 / — ms |" in page
    # A short run is shown apart, after the full runs, and replaces none of their rows.
    assert (
        page.index("| ruby hello | 888 / — ms | — / — ms |") > page.index("### Short run: docker") > page.index("121")
    )
    assert page.index("2026-02-01") < page.index("2026-01-01")  # newest first
    assert "Test CPU, 2 cores, 4 GiB, Linux 6.1, docker 26" in page
    assert "fork of a warm interpreter 4.5 ms" in page and "fork of a warm interpreter 3 ms" in page
