"""The README's speed table: the newest full result of each measure and engine, beside issue #27's targets.

benchmarks/render.py writes it between the two markers in README.md (and `--check` compares it), so the README
quotes no number by hand. A value that misses its target says by how much; the line under the table says
which runs the numbers come from, on what machine and at what load. Short runs are never used.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

Json = dict[str, Any]

BEGIN = "<!-- speed table: made by benchmarks/render.py from benchmarks/measured/, not by hand -->"
END = "<!-- end of the speed table -->"
ENGINES = ("bubblewrap", "docker", "podman", "nsjail")
TITLES = {"bubblewrap": "bubblewrap", "docker": "Docker", "podman": "Podman", "nsjail": "NsJail"}


def _dict(value: object) -> Json:
    return cast("Json", value) if isinstance(value, dict) else {}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _scenario_p50(name: str) -> Callable[[Json], float | None]:
    """A scenario's back-to-back p50 as users get it: the zygote's row where a run measured both."""

    def read(report: Json) -> float | None:
        for source in (_dict(report.get("zygote")), report):
            found = _dict(_dict(_dict(source.get("scenarios")).get(name)).get("back_to_back")).get("p50_ms")
            if _number(found) is not None:
                return _number(found)
        return None

    return read


def _rate(key: str) -> Callable[[Json], float | None]:
    def read(report: Json) -> float | None:
        for source in (_dict(report.get("zygote")), report):
            if _number(source.get(key)) is not None:
                return _number(source.get(key))
        return None

    return read


def _start_ratio(report: Json) -> float | None:
    start = _number(report.get("start_to_tools_list_ms"))
    floor = _number(_dict(report.get("start_floor_ms")).get("import mcp.server (the official SDK)"))
    return round(start / floor, 2) if start is not None and floor else None


def _path(*keys: str) -> Callable[[Json], float | None]:
    def read(report: Json) -> float | None:
        value: object = report
        for key in keys:
            value = _dict(value).get(key)
        return _number(value)

    return read


@dataclass(frozen=True)
class Measure:
    label: str
    benchmark: str
    read: Callable[[Json], float | None]
    unit: str
    # Per engine: the most (or, with `at_least`, the least) it may be; absent: no target for that engine.
    targets: dict[str, float]
    at_least: bool = False

    def cell(self, value: float | None, engine: str) -> str:
        if value is None:
            return "—"
        shown = f"{value:g}{self.unit}"
        target = self.targets.get(engine)
        if target is None or (value >= target if self.at_least else value <= target):
            return shown
        by = target / value if self.at_least else value / target
        return f"{shown} ✗ ({by:.1f}× off)" if by >= 1.05 else f"{shown} ✗"

    def target(self) -> str:
        """The targets in the engines' column order ("—" for an engine without one), once if all are the same."""
        if not self.targets:
            return ""
        sign = "≥" if self.at_least else "≤"
        values = [self.targets.get(engine) for engine in ENGINES]
        if len(set(values)) == 1:
            return f"{sign} {values[0]:g}{self.unit}"
        return f"{sign} " + " / ".join("—" if v is None else f"{v:g}" for v in values) + self.unit


# Calls per second with 8 in flight, alone and beside CPU hogs alike (NsJail has none).
THROUGHPUT_TARGETS = {"bubblewrap": 120.0, "docker": 60.0, "podman": 60.0}
MEASURES = (
    Measure(
        "`print(1)`, back to back, p50",
        "table",
        _scenario_p50("python print(1)"),
        " ms",
        {"bubblewrap": 8, "docker": 12, "podman": 12, "nsjail": 15},
    ),
    Measure(
        "a matplotlib plot back as PNG, back to back, p50",
        "table",
        _scenario_p50("python matplotlib plot"),
        " ms",
        dict.fromkeys(ENGINES, 50),
    ),
    Measure(
        "16 calls, 8 in flight",
        "table",
        _rate("calls_per_s_16_calls_8_in_flight"),
        " calls/s",
        THROUGHPUT_TARGETS,
        at_least=True,
    ),
    Measure(
        "the same beside CPU hogs on every core but one",
        "table",
        _rate("calls_per_s_16_calls_8_in_flight_beside_hogs"),
        " calls/s",
        THROUGHPUT_TARGETS,
        at_least=True,
    ),
    Measure("Java hello, back to back, p50", "table", _scenario_p50("java hello"), " ms", dict.fromkeys(ENGINES, 200)),
    Measure("start to `tools/list` ÷ importing the MCP SDK", "table", _start_ratio, "×", dict.fromkeys(ENGINES, 1.1)),
    Measure(
        "a cell in one of 128 open sessions, p50",
        "sessions",
        _path("cell_ms", "p50"),
        " ms",
        {"bubblewrap": 20, "docker": 20},
    ),
    Measure(
        "memory per idle session (its cgroup + the server's share)",
        "sessions",
        _path("per_session_mib"),
        " MiB",
        {"bubblewrap": 15, "docker": 15},
    ),
    Measure(
        "server RSS with 128 sessions open",
        "sessions",
        _path("server_rss_mib", "with_sessions"),
        " MiB",
        {"bubblewrap": 150, "docker": 150},
    ),
    Measure(
        "10 minutes of mixed load: p95 of the last minute ÷ the first",
        "soak",
        _path("last_minute_p95_over_first"),
        "×",
        dict.fromkeys(ENGINES, 1.5),
    ),
)


def _newest(results: list[Json], measure: Measure, engine: str) -> tuple[float, Json] | None:
    """The newest full run of the measure's benchmark on `engine` that measured it (results are oldest first)."""
    for result in reversed(results):
        if result.get("benchmark") != measure.benchmark or result.get("short"):
            continue
        if result.get("backend") != engine:
            continue
        value = measure.read(_dict(result.get("report")))
        if value is not None:
            return value, result
    return None


def _loads(result: Json) -> list[float]:
    """The 1-minute load averages a run recorded (at its start and end, or once)."""
    report = _dict(result.get("report"))
    found: list[object] = [report.get("load_average_at_start"), report.get("load_average_at_end")]
    found += list(_dict(report.get("load_average")).values()) + [_dict(result.get("machine")).get("load_average")]
    return [
        float(value[0])  # pyright: ignore[reportUnknownArgumentType]
        for value in found
        if isinstance(value, list) and value and _number(value[0]) is not None  # pyright: ignore[reportUnknownArgumentType]
    ]


def speed_table(results: list[Json], machine: Callable[[Json], str]) -> str:
    """The README's section between the markers (markers included)."""
    used: dict[str, Json] = {}
    lines = [
        "| | " + " | ".join(TITLES[e] for e in ENGINES) + " | target |",
        "|---|" + "---|" * len(ENGINES) + "---|",
    ]
    for measure in MEASURES:
        cells: list[str] = []
        for engine in ENGINES:
            found = _newest(results, measure, engine)
            if found is None:
                cells.append("—")
                continue
            value, result = found
            used[f"{result['date']}-{result['benchmark']}-{engine}"] = result
            cells.append(measure.cell(value, engine))
        lines.append(f"| {measure.label} | " + " | ".join(cells) + f" | {measure.target()} |")
    dates = sorted({str(result["date"])[:10] for result in used.values()})
    machines = sorted({machine(result) for result in used.values()})
    loads = [load for result in used.values() for load in _loads(result)]
    spread = f", 1-minute load average {min(loads):.1f} to {max(loads):.1f} during them" if loads else ""
    footer = textwrap.fill(
        f"From the newest full runs ({', '.join(dates)}{spread}) on {'; '.join(machines)}. ✗: a target missed, by"
        " the factor shown; [benchmarks](docs/benchmarks.md) has every run with its floors, and what bounds each"
        " missed target.",
        width=115,
    )
    return "\n".join([BEGIN, "", *lines, "", footer, "", END])


def replace_section(readme: str, section: str) -> str:
    """README text with the section between the markers replaced (both markers must be there, once each)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start or readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError("README.md must hold the speed table's two markers, once each")
    return readme[:start] + section + readme[end + len(END) :]
