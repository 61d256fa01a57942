"""The package's layers: each module imports only from its own layer and those below it,
and no modules import each other in a circle. The table is the one docs/architecture.md
shows; a new module finds its row here first."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "kimik3_operator"

# Lowest first. A module's layer is its longest matching prefix (a path below the package).
# The runtime runs a reconciler it is handed (runtime.manager.Reconciler); the host hands it
# the controller's, so neither imports the other.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("programs", ("programs/",)),
    (
        "vocabulary",
        ("api/constants", "api/names", "api/flags", "api/quantities", "api/conditions"),
    ),
    ("spec", ("api/",)),
    ("support", ("kube", "redact", "metrics", "config", "events")),
    ("checks", ("preflight/", "builders/")),
    ("observation", ("observation/",)),
    ("runtime", ("runtime/",)),
    ("controller", ("controller/",)),
    ("host", ("host", "cli", "status_view", "__init__", "__main__")),
)


def module_path(module: str) -> str | None:
    """'kimik3_operator.api.spec' -> 'api/spec'; None for a module not of the package."""
    if module == "kimik3_operator":
        return "__init__"
    if not module.startswith("kimik3_operator."):
        return None
    path = module.removeprefix("kimik3_operator.").replace(".", "/")
    if (PACKAGE / path).is_dir():
        return f"{path}/__init__"
    return path


def layer(path: str) -> int:
    """A prefix ending in / is a folder; any other is a module (and what is below it)."""
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            folder = prefix if prefix.endswith("/") else prefix + "/"
            if path == prefix or path.startswith(folder):
                best = max(best, (len(prefix), index))
    assert best[1] >= 0, f"{path}: no row in LAYERS"
    return best[1]


def modules() -> Iterator[tuple[str, ast.Module]]:
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(PACKAGE).with_suffix("").as_posix()
        yield path, ast.parse(file.read_text())


def imports(path: str, tree: ast.Module) -> set[str]:
    """Every module of the package that ``path`` imports, at any depth (TYPE_CHECKING too)."""
    found: set[str] = set()
    package = "kimik3_operator." + path.replace("/", ".")
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: -node.level]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = module_path(f"{base}.{alias.name}")
                is_module = sub is not None and (PACKAGE / f"{sub}.py").exists()
                names.append(f"{base}.{alias.name}" if is_module else base)
        for name in names:
            target = module_path(name)
            if target is not None and (PACKAGE / f"{target}.py").exists():
                found.add(target)
    found.discard(path)
    return found


def graph() -> dict[str, set[str]]:
    return {path: imports(path, tree) for path, tree in modules()}


def arrows_up(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})"
        for a, targets in edges.items()
        for b in targets
        if layer(b) > layer(a)
    )


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    for path, _ in modules():
        layer(path)


def test_no_module_imports_from_a_layer_above_it() -> None:
    assert arrows_up(graph()) == []


def test_the_controller_and_the_runtime_do_not_import_each_other() -> None:
    edges = graph()
    crossing = [
        f"{a} imports {b}"
        for a, targets in edges.items()
        for b in targets
        if {a.split("/")[0], b.split("/")[0]} == {"controller", "runtime"}
    ]
    assert crossing == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(graph()) == []


def test_the_checker_sees_an_arrow_up_and_a_circle() -> None:
    edges = {"api/spec": {"controller/reconcile"}, "controller/reconcile": {"api/spec"}}
    assert arrows_up(edges) == ["api/spec (spec) imports controller/reconcile (controller)"]
    assert circles(edges) == [["api/spec", "controller/reconcile"]]
