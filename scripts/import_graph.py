"""The package's import graph, read from the source (nothing is imported): its modules, edges, cycles, the
imports that reach up a layer, and its floors (the longest chain of imports, cycles counted as one module).

Every import statement counts, wherever it stands: at the top of a module, inside a function (it runs when the
function does) or under `if TYPE_CHECKING:` (the design depends on it all the same). A `from a import b` is an
edge to the module `a.b` when that is a module of the package, else to `a`.

Layers, lowest first; a module may import its own layer and the ones below. A name is a top-level module or
folder of the package; `*` stands for every flat top-level module not named elsewhere (the vocabulary):

    python scripts/import_graph.py                                   # the layers below
    python scripts/import_graph.py --layers '*' 'backends seccomp' 'run' 'server cli'
    python scripts/import_graph.py --edges                           # every edge too

Exits 1 when the graph has a cycle; upward imports are reported, not failed (pass --strict to fail them).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llm_sandbox_mcp"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
LAYERS = (
    ("vocabulary", ("*", "runners")),
    ("features", ("backends", "seccomp", "egress", "images")),
    ("run", ("run",)),
    ("face", ("server", "commands", "cli", "__main__", "__init__")),
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    kind: str  # "top" (runs on import), "lazy" (inside a function), "typing" (under TYPE_CHECKING)

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.kind}, line {self.line})"


def module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py")) if "__pycache__" not in path.parts}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement and its kind."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "typing" if kind == "typing" else "lazy")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), "typing")
                for statement in child.orelse:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, "top")


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def edges(known: dict[str, Path]) -> list[Edge]:
    found: list[Edge] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, kind in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _absolute(node, name, path.name == "__init__.py")
                for alias in node.names:
                    candidate = f"{source}.{alias.name}"
                    targets.append(candidate if candidate in known else source)
            for target in targets:
                while target and target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]  # `import a.b.c` of a name that is not a module
                if target in known and target != name:
                    found.append(Edge(name, target, node.lineno, kind))
    return sorted(set(found), key=lambda e: (e.source, e.target, e.line))


def cycles(names: Iterable[str], graph: Sequence[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    successors: dict[str, set[str]] = {name: set() for name in names}
    for edge in graph:
        successors[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(successors[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(successors) + 100))
    try:
        for name in sorted(successors):
            if name not in index:
                visit(name)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def longest_chain(names: Iterable[str], graph: Sequence[Edge]) -> list[str]:
    """The longest chain of imports (its length: the floors), with each cycle counted as one module."""
    names = list(names)
    component = {name: name for name in names}
    for members in cycles(names, graph):
        for member in members:
            component[member] = members[0]
    successors: dict[str, set[str]] = {component[name]: set() for name in names}
    for edge in graph:
        if component[edge.source] != component[edge.target]:
            successors[component[edge.source]].add(component[edge.target])
    chains: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in chains:
            below = max((chain(target) for target in sorted(successors[node])), key=len, default=list[str]())
            chains[node] = [node, *below]
        return chains[node]

    return max((chain(node) for node in sorted(successors)), key=len, default=list[str]())


def layer_of(name: str, layers: Sequence[tuple[str, Sequence[str]]], known: dict[str, Path]) -> int:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    wildcard: int | None = None
    for number, (_, members) in enumerate(layers):
        if top in members:
            return number
        if "*" in members:
            wildcard = number
    flat = len(parts) == 2 and known[name].name != "__init__.py"
    if flat and wildcard is not None:
        return wildcard
    raise SystemExit(f"{name} is in no layer: name its folder in --layers")


def upward(
    graph: Sequence[Edge], layers: Sequence[tuple[str, Sequence[str]]], known: dict[str, Path]
) -> list[tuple[Edge, str, str]]:
    found: list[tuple[Edge, str, str]] = []
    for edge in graph:
        source, target = layer_of(edge.source, layers, known), layer_of(edge.target, layers, known)
        if target > source:
            found.append((edge, layers[source][0], layers[target][0]))
    return found


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=ROOT, help="the package's folder")
    parser.add_argument(
        "--layers",
        nargs="+",
        metavar="NAMES",
        help="the layers, lowest first, each a quoted list of top-level names ('*': the flat modules)",
    )
    parser.add_argument("--edges", action="store_true", help="list every edge")
    parser.add_argument("--strict", action="store_true", help="exit 1 on an upward import too")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    layers: list[tuple[str, Sequence[str]]] = (
        [(f"layer {n}", spec.split()) for n, spec in enumerate(args.layers)] if args.layers else list(LAYERS)
    )
    known = modules(args.root)
    graph = edges(known)
    found = cycles(known, graph)
    up = upward(graph, layers, known)
    out = sys.stdout
    kinds = {kind: sum(1 for edge in graph if edge.kind == kind) for kind in ("top", "lazy", "typing")}
    out.write(f"modules: {len(known)}\nedges: {len(graph)} ({', '.join(f'{k} {v}' for k, v in kinds.items())})\n")
    out.write(f"cycles: {len(found)}\n")
    for members in found:
        inside = [str(edge) for edge in graph if edge.source in members and edge.target in members]
        out.write(f"  {' <-> '.join(members)}\n" + "".join(f"    {line}\n" for line in inside))
    out.write(f"upward imports: {len(up)}\n")
    for edge, source, target in up:
        out.write(f"  {edge}: {source} imports {target}\n")
    chain = longest_chain(known, graph)
    out.write(f"floors: {len(chain)}\n  {' -> '.join(name.removeprefix(PACKAGE + '.') for name in chain)}\n")
    if args.edges:
        out.write("".join(f"{edge}\n" for edge in graph))
    return 1 if found or (args.strict and up) else 0


if __name__ == "__main__":
    sys.exit(main())
