"""The rules of docs/architecture.md §5, checked from the source (AST): no import cycles between the
package's modules, no package importing one above it (the layers below), Ray imported only in the
packages that run inside Ray or talk to it (``RAY_ROOMS``), torch never in config/ (nor at module level
in plan/), and short package maps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sweep"
# Where Ray may be imported: the cluster, the schedulers and searchers, the Tune hooks, the trial, the
# driver, the Jobs client and the test clusters. Everything below them is plain Python.
RAY_ROOMS = ("sweep.cluster", "sweep.schedulers", "sweep.hooks", "sweep.trial", "sweep.driver",
             "sweep.ray_jobs", "sweep.testing")

# Lowest first: a module may import its own layer and those below, never one above (docs/architecture.md §1).
BASE = ("errors", "secrets", "disk", "files", "lock", "remote_files", "trials", "failures", "export_layout")
LAYERS = (
    tuple(f"sweep.{m}" for m in BASE),
    ("sweep.config",), ("sweep.data",), ("sweep.models",), ("sweep.results",), ("sweep.tracking",),
    ("sweep.storage",), ("sweep.train",), ("sweep.plan",), ("sweep.serving",),
    ("sweep.cluster",), ("sweep.schedulers",), ("sweep.hooks",), ("sweep.trial",), ("sweep.driver",),
    ("sweep.ray_jobs", "sweep.testing"),
    ("sweep.app", "sweep.__main__", "sweep.cli"),
)
PACKAGES = ("config", "data", "models", "train", "plan", "results", "storage", "serving", "cluster",
            "schedulers", "hooks", "trial", "driver", "testing", "cli")


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
        if not any(module_name(p, package) == room or module_name(p, package).startswith(room + ".")
                   for room in RAY_ROOMS)
        and any(m == "ray" or m.startswith("ray.") for m in imports_of(p))
    )


def layer_of(module: str) -> int:
    for rank, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return rank
    raise AssertionError(f"{module} is in no layer of LAYERS: place it there")


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """'a -> b' for every import of a module in a higher layer."""
    return sorted(f"{a} -> {b}" for a, targets in import_graph(package).items() if a != "sweep"
                  for b in targets if b != "sweep" and layer_of(b) > layer_of(a))


def torch_at_module_level(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    top += [n for branch in tree.body if isinstance(branch, ast.If)  # `if TYPE_CHECKING:` counts too
            for n in ast.walk(branch) if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
    return any(m.split(".")[0] in ("torch", "transformers") for m in names)



def private_imports(package: Path = PACKAGE) -> list[str]:
    """'a -> b._name' for every private name one module imports from another: a name two modules share
    is part of the one's interface and says so by its spelling."""
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package.name:
                found += [f"{module_name(path, package)} -> {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return sorted(found)


def module_names_twice(package: Path = PACKAGE) -> list[str]:
    """Module file names used in two places (``__init__``/``__main__`` aside): ``serve.py`` in three
    packages is three things a reader must tell apart by their folder."""
    seen: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.stem not in ("__init__", "__main__") and "conf" not in path.relative_to(package).parts:
            seen.setdefault(path.name, []).append(module_name(path, package))
    return sorted(f"{name}: {', '.join(modules)}" for name, modules in seen.items() if len(modules) > 1)


def test_no_private_name_is_imported_from_another_module() -> None:
    assert private_imports() == []


def test_no_module_name_is_used_twice() -> None:
    assert module_names_twice() == []


def test_the_name_checks_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "sweep"
    for folder in ("serving", "cli"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "serve.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from sweep.serving.serve import _port, PORT, __all__\n")
    assert private_imports(pkg) == ["sweep.a -> sweep.serving.serve._port"]
    assert module_names_twice(pkg) == ["serve.py: sweep.cli.serve, sweep.serving.serve"]

def test_the_package_has_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_ray_is_imported_only_in_the_ray_rooms() -> None:
    assert ray_outside_run() == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The two checks find what they look for: a cycle (also through a lazy import) and a stray ray import."""
    pkg = tmp_path / "sweep"
    (pkg / "driver").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "driver" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from sweep.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from sweep import a\n")
    (pkg / "driver" / "ok.py").write_text("import ray\n")
    (pkg / "stray.py").write_text("from ray import tune\n")
    assert find_cycle(import_graph(pkg)) == ["sweep.a", "sweep.b", "sweep.a"]
    assert ray_outside_run(pkg) == ["sweep.stray"]


def test_no_package_imports_one_above_it() -> None:
    assert upward_imports() == []


def test_config_never_imports_torch_and_plan_only_inside_functions() -> None:
    config = [module_name(p) for p in (PACKAGE / "config").glob("*.py")
              if any(m.split(".")[0] in ("torch", "transformers") for m in imports_of(p))]
    plan = [module_name(p) for p in (PACKAGE / "plan").glob("*.py") if torch_at_module_level(p)]
    assert (config, plan) == ([], [])


def test_the_layer_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "sweep"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "__init__.py").write_text("")
    (pkg / "config" / "settings.py").write_text("def f():\n    from sweep.driver.tuner import x\n")
    (pkg / "driver").mkdir()
    (pkg / "driver" / "__init__.py").write_text("")
    (pkg / "driver" / "tuner.py").write_text("from sweep.config.settings import f\n")
    assert upward_imports(pkg) == ["sweep.config.settings -> sweep.driver.tuner"]
    assert torch_at_module_level(pkg / "config" / "settings.py") is False
    (pkg / "config" / "settings.py").write_text("import torch\n")
    assert torch_at_module_level(pkg / "config" / "settings.py") is True


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_init_is_a_short_map(package: str) -> None:
    """An __init__.py says what is inside (every module named) and imports nothing: importing one
    module of a package must not load the others (the CLI's errors stay free of torch)."""
    init = PACKAGE / package / "__init__.py"
    tree = ast.parse(init.read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    doc = ast.get_docstring(tree) or ""
    modules = sorted(p.stem for p in (PACKAGE / package).glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if f"{m}.py" not in doc] == []


# What starts Ray in a test module: a local Ray, a cluster of raylets, a `ray start` head, a sweep run
# in-process or as `python -m sweep` (which starts its own local Ray).
RAY_STARTERS = ("ray.init(", "cluster_utils", "AutoscalingCluster", "own_disk_cluster", "local_ray", "run_tune(",
                "from sweep.app import run", "sweep_cmd(", 'Popen([sys.executable, "-m", "sweep"', '"start", "--head"')
TESTS = Path(__file__).resolve().parent


def unmarked_ray_modules(tests: Path = TESTS) -> list[str]:
    """Test modules that start Ray without ``pytest.mark.ray``: under `make test`'s two xdist workers they
    would run beside another Ray test, whose ``ray stop --force`` ends their Ray mid-test."""
    from tests.helpers.sweeps import ray_test_modules

    marked = ray_test_modules(tests)
    return sorted(p.name for p in tests.glob("test_*.py")  # this module names the starters: not one of them
                  if p != Path(__file__) and any(s in p.read_text() for s in RAY_STARTERS) and p.name not in marked)


def test_every_test_module_that_starts_ray_is_marked_ray(tmp_path: Path) -> None:
    assert unmarked_ray_modules() == []
    (tmp_path / "test_a.py").write_text("def test_x(local_ray):\n    pass\n")
    marked = "import pytest\npytestmark = pytest.mark.ray\n\ndef test_x(local_ray):\n    pass\n"
    (tmp_path / "test_b.py").write_text(marked)
    (tmp_path / "test_c.py").write_text("def test_x():\n    pass\n")
    assert unmarked_ray_modules(tmp_path) == ["test_a.py"]


def test_the_ray_modules_are_one_xdist_work_unit_and_the_others_spread() -> None:
    from tests.helpers.sweeps import RAY_GROUP, ray_test_modules, work_unit

    ray_modules = ray_test_modules(TESTS)
    assert {"test_sweep_ray.py", "test_submit.py", "test_cli.py"} <= ray_modules
    assert "test_serve.py" not in ray_modules and "test_architecture.py" not in ray_modules
    assert work_unit("tests/test_sweep_ray.py::test_x[a]", ray_modules) == RAY_GROUP
    assert work_unit("tests/test_submit.py::test_y", ray_modules) == RAY_GROUP
    assert work_unit("tests/test_serve.py::test_z", ray_modules) == "tests/test_serve.py::test_z"
