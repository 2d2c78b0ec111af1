"""The package's import graph (scripts/import_graph.py): no cycle, and the checker sees what it must; and what
importing the vocabulary loads (in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FEATURES = ("egress", "images", "backends", "seccomp", "run", "server", "commands")


def _loaded(*modules: str) -> list[str]:
    """The package's modules a fresh interpreter holds after importing `modules`."""
    code = f"import json, sys\nimport {', '.join(modules)}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return [name for name in json.loads(done.stdout) if name.startswith("llm_sandbox_mcp.")]


def _graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    return root


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    known = graph.modules(graph.ROOT)
    assert "llm_sandbox_mcp.config" in known and "llm_sandbox_mcp.backends" in known
    assert graph.cycles(known, graph.edges(known)) == []


def test_a_cycle_counts_whatever_kind_of_import_closes_it(tmp_path: Path) -> None:
    """Top-level, in a function or under TYPE_CHECKING: each is a dependency, and any of them closes a cycle."""
    root = _package(
        tmp_path,
        {
            "config.py": "from pkg import images\n",
            "images/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.config import S\n",
            "run/__init__.py": "",
            "run/a.py": "def f():\n    from .b import g\n",
            "run/b.py": "from pkg.run import a\n",
            "flat.py": "import pkg.run.a\n",
        },
    )
    graph = _graph()
    known = graph.modules(root)
    edges = graph.edges(known)
    kinds = {(edge.source, edge.target): edge.kind for edge in edges}
    assert kinds == {
        ("pkg.config", "pkg.images"): "top",
        ("pkg.images", "pkg.config"): "typing",
        ("pkg.run.a", "pkg.run.b"): "lazy",
        ("pkg.run.b", "pkg.run.a"): "top",
        ("pkg.flat", "pkg.run.a"): "top",
    }
    assert graph.cycles(known, edges) == [["pkg.config", "pkg.images"], ["pkg.run.a", "pkg.run.b"]]
    layers = [("vocabulary", ["*"]), ("features", ["images"]), ("run", ["run"])]
    upward = [(edge.source, edge.target) for edge, _, _ in graph.upward(edges, layers, known)]
    assert upward == [("pkg.config", "pkg.images"), ("pkg.flat", "pkg.run.a")]
    assert graph.main(["--root", str(root), "--layers", "* runners", "images", "run"]) == 1


def test_the_settings_load_no_feature_package() -> None:
    loaded = _loaded("llm_sandbox_mcp.config")
    assert "llm_sandbox_mcp.config" in loaded
    assert [name for name in loaded if name.split(".")[1] in FEATURES] == []


def test_the_egress_package_loads_no_part_until_one_is_imported() -> None:
    loaded = _loaded("llm_sandbox_mcp.config", "llm_sandbox_mcp.egress")
    assert "llm_sandbox_mcp.egress" in loaded
    assert [name for name in loaded if name.startswith("llm_sandbox_mcp.egress.")] == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    """Vocabulary < engines, seccomp, egress, images < run core < MCP face and commands (the script's LAYERS)."""
    graph = _graph()
    known = graph.modules(graph.ROOT)
    assert [str(edge) for edge, _, _ in graph.upward(graph.edges(known), graph.LAYERS, known)] == []


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_daemonless_engines_share_through_their_own_folder_never_each_other() -> None:
    graph = _graph()
    known = graph.modules(graph.ROOT)
    engines = ("llm_sandbox_mcp.backends._bubblewrap", "llm_sandbox_mcp.backends._nsjail")
    crossing = [
        str(edge)
        for edge in graph.edges(known)
        for source in engines
        for target in engines
        if source != target and _within(edge.source, source) and _within(edge.target, target)
    ]
    assert crossing == []
    shared = "llm_sandbox_mcp.backends._daemonless"
    assert not [str(edge) for edge in graph.edges(known) if _within(edge.source, shared) and edge.target in engines]


def test_no_private_engine_module_is_imported_from_outside_the_engines() -> None:
    graph = _graph()
    known = graph.modules(graph.ROOT)
    private = [
        str(edge)
        for edge in graph.edges(known)
        if edge.target.startswith("llm_sandbox_mcp.backends._") and not _within(edge.source, "llm_sandbox_mcp.backends")
    ]
    assert private == []
