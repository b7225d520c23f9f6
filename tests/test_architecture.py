"""The rules of docs/architecture.md §5, checked from the source (AST): no import cycles between the
package's modules, Ray imported only under sweep/run/ (what runs inside Ray or talks to it), and
short package maps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sweep"
RAY_ROOM = "sweep.run"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module named by an import in the file, at the top or inside a function (lazy imports count)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from sweep.data import glue`
    return names


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def ray_outside_run(package: Path = PACKAGE) -> list[str]:
    return sorted(
        module_name(p, package) for p in package.rglob("*.py")
        if not module_name(p, package).startswith(RAY_ROOM)
        and any(m == "ray" or m.startswith("ray.") for m in imports_of(p))
    )


def test_the_package_has_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_ray_is_imported_only_under_sweep_run() -> None:
    assert ray_outside_run() == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The two checks find what they look for: a cycle (also through a lazy import) and a stray ray import."""
    pkg = tmp_path / "sweep"
    (pkg / "run").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "run" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from sweep.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from sweep import a\n")
    (pkg / "run" / "ok.py").write_text("import ray\n")
    (pkg / "stray.py").write_text("from ray import tune\n")
    assert find_cycle(import_graph(pkg)) == ["sweep.a", "sweep.b", "sweep.a"]
    assert ray_outside_run(pkg) == ["sweep.stray"]


@pytest.mark.parametrize("package", ["data", "storage", "run", "serving"])
def test_each_package_init_is_a_short_map(package: str) -> None:
    """An __init__.py says what is inside (every module named) and imports nothing: importing one
    module of a package must not load the others (the CLI's errors stay free of torch)."""
    init = PACKAGE / package / "__init__.py"
    tree = ast.parse(init.read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    doc = ast.get_docstring(tree) or ""
    modules = sorted(p.stem for p in (PACKAGE / package).glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if f"{m}.py" not in doc] == []
