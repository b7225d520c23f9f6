"""The rules of docs/architecture.md §5, checked from the source (AST): no import cycles between the
package's modules, no package importing one above it (the layers below), Ray imported only in the
packages that run inside Ray or talk to it (``RAY_ROOMS``), torch never in config/ (nor at module level
in plan/), and short package maps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sweep"
# Where Ray may be imported: the cluster (and its Jobs client), the schedulers and searchers, the Tune hooks,
# the trial, the driver and the test clusters. Everything below them is plain Python.
RAY_ROOMS = ("sweep.cluster", "sweep.schedulers", "sweep.hooks", "sweep.trial", "sweep.driver", "sweep.testing")

# Lowest first: a module may import its own layer and those below, never one above (docs/architecture.md §1).
# The small single-job helpers beside the packages: at most 8 (test_few_flat_modules); the rest joins a package.
BASE = ("errors", "secrets", "disk", "files", "lock", "remote_files", "failures")
LAYERS = (
    tuple(f"sweep.{m}" for m in BASE),
    ("sweep.config",), ("sweep.data",), ("sweep.models",), ("sweep.results",), ("sweep.storage",),
    ("sweep.tracking",), ("sweep.train",), ("sweep.plan",), ("sweep.serving",), ("sweep.outputs",),
    ("sweep.cluster",), ("sweep.schedulers",), ("sweep.hooks",), ("sweep.trial",), ("sweep.driver",),
    ("sweep.testing",),
    ("sweep.app", "sweep.__main__", "sweep.cli"),
)
PACKAGES = ("config", "data", "models", "train", "plan", "results", "storage", "serving", "outputs", "cluster",
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



# The cluster package reads Ray's autoscaler and GCS state (no public API for either) and holds the trial
# and hook side's few private uses (cluster/ray_internals.py); the test clusters start nodes by hand.
RAY_INTERNALS_HOMES = ("sweep.cluster.", "sweep.testing.")


def ray_internals_imports(package: Path = PACKAGE) -> list[str]:
    """Modules outside RAY_INTERNALS_HOMES that import Ray's private modules."""
    def private(name: str) -> bool:
        parts = name.split(".")
        return parts[0] == "ray" and any(p.startswith("_") for p in parts[1:])

    return sorted(
        f"{module_name(p, package)} -> {m}" for p in package.rglob("*.py") for m in imports_of(p)
        if private(m) and not any(module_name(p, package).startswith(home) for home in RAY_INTERNALS_HOMES))


def test_rays_private_modules_are_imported_in_one_place() -> None:
    assert ray_internals_imports() == []

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
    (pkg / "cli" / "tuner.py").write_text("from ray.train._internal.session import get_session\nimport ray.train\n")
    (pkg / "cluster").mkdir()
    (pkg / "cluster" / "ray_internals.py").write_text("from ray._private import state\n")  # its home
    assert ray_internals_imports(pkg) == ["sweep.cli.tuner -> ray.train._internal.session",
                                          "sweep.cli.tuner -> ray.train._internal.session.get_session"]

# Scheduler and searcher names (sweep.scheduler, sweep.search_alg) are compared only where policies are built.
# Every sweep.scheduler and sweep.search_alg. Not "grid": no choice has that value (every searcher hands
# out the grid's points), and the one comparison with it, validate's `kind == "grid"`, tells sweep.grid
# from sweep.search, not a policy.
POLICY_NAMES = frozenset({"fifo", "asha", "seed_halving", "pbt", "random", "optuna"})
# where the names may be compared: the policies' own table, and the schema that declares the choices
NAMES_HOME = ("schedulers/policies.py", "config/settings.py")  # relative to the package


def _compared_names(node: ast.AST) -> list[str]:
    """The policy names a comparison operand (or a case pattern) holds: a string, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in POLICY_NAMES else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for element in node.elts for name in _compared_names(element)]
    if isinstance(node, ast.MatchValue):
        return _compared_names(node.value)
    if isinstance(node, ast.MatchOr):
        return [name for pattern in node.patterns for name in _compared_names(pattern)]
    return []


def _dispatches(tree: ast.AST) -> list[ast.AST]:
    """The comparisons (==, !=, in, not in) and match cases on a policy's name in one module."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            if any(_compared_names(operand) for operand in (node.left, *node.comparators)):
                found.append(node)
        elif isinstance(node, ast.match_case) and _compared_names(node.pattern):
            found.append(node.pattern)
    return found


def string_dispatch_on_policy_names(package: Path) -> list[str]:
    """'path:line: code' for every comparison (or match case) on a scheduler's or searcher's name outside
    the policies (and the schema that declares the choices): those modules must ask the policy instead."""
    hits = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative in NAMES_HOME:
            continue
        nodes = sorted(_dispatches(ast.parse(path.read_text(), filename=str(path))), key=lambda n: n.lineno)
        hits += [f"{package.name}/{relative}:{node.lineno}: {ast.unparse(node)}" for node in nodes]
    return hits


def test_no_module_but_the_policies_compares_a_policy_name() -> None:
    assert string_dispatch_on_policy_names(PACKAGE) == []


def test_the_string_dispatch_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "sweep"
    (pkg / "schedulers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tuner.py").write_text('def f(x):\n    if x.scheduler == "pbt":\n        return 1\n'
                                  '    return x.search_alg in ("optuna", "other")\n')
    (pkg / "boards.py").write_text('def g(x):\n    match x.scheduler:\n        case "asha" | "fifo":\n'
                                   '            return 1\n')
    (pkg / "fine.py").write_text('def h(x):\n    return x.kind == "s3" or x.dist != "choice"\n')
    (pkg / "schedulers" / "policies.py").write_text('def k(x):\n    return x == "pbt"\n')  # their home
    assert string_dispatch_on_policy_names(pkg) == [
        "sweep/boards.py:3: 'asha' | 'fifo'",
        "sweep/tuner.py:2: x.scheduler == 'pbt'",
        "sweep/tuner.py:4: x.search_alg in ('optuna', 'other')",
    ]


# --- each name builds its policy ------------------------------------------------------------------

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


# What starts Ray in a test: a local Ray (or joining one), a cluster of raylets, a `ray start` head or
# `ray stop`, the Ray fixtures of tests/helpers, a sweep in-process (sweep.run, sweep.app.run, run_tune) or
# as `python -m sweep` (its own local Ray), and Ray's calls that start one when none runs (.remote, a Tuner).
# Searched for in a test's code, the fixtures it requests and its module's helpers it uses (tests/helpers/lanes.py).
RAY_STARTERS = (r"\bray\.init\(", r"\bcluster_utils\b", r"\bAutoscalingCluster\b", r"\bautoscaling_cluster\(",
                r"\bOwnDiskCluster\b", r"\bray_stop\(", r"\blocal_ray\b", r"\bown_disk_cluster\b", r"\brun_tune\(",
                r"\bsweep\.(app\.)?run\(", r"\bsweep_cmd\(", r"\bsweep_killed_after\(",
                r"[\"']start[\"'],\s*[\"']--head[\"']", r"[\"']stop[\"'],\s*[\"']--force[\"']",
                r"\.remote\(", r"\bray\.(get|put|wait)\(", r"\bTuner\(", r"\btune\.run\(")
# ... and these, used by the name a `from M import name` gives them (`run(cfg, out)`, `Cluster(...)`).
RAY_STARTER_CALLABLES = frozenset({
    "ray.init", "ray.cluster_utils.Cluster", "ray.cluster_utils.AutoscalingCluster", "sweep.run", "sweep.app.run",
    "sweep.driver.tuner.run_tune", "sweep.cluster.connect.connect", "sweep.testing.local_cluster.autoscaling_cluster",
    "sweep.testing.local_cluster.OwnDiskCluster", "sweep.testing.local_cluster.ray_stop",
    "tests.helpers.sweeps.sweep_cmd", "tests.helpers.sweeps.sweep_killed_after",
    "tests.helpers.own_disks.OwnDiskSweeps",
})
# `python -m sweep COMMAND` that starts no Ray (submit talks to a running cluster's dashboard).
QUIET_COMMANDS = frozenset({"serve", "infer", "upload", "upload-mlflow", "replay", "ui", "submit"})
# Tests whose code names a starter but whose sweep ends before Ray starts (the CLI's checks, sweep.app.run's
# before run_tune): Ray-free, beside the Ray lane. A test here must hold to it: it asserts the early exit.
STOPS_BEFORE_RAY = {
    "tests/test_cli.py::test_help_lists_every_task_and_model": "--help",
    "tests/test_cli.py::test_bad_input_is_one_clear_line_and_writes_nothing": "config/data errors: exit 2",
    "tests/test_cli.py::test_missing_task_folder_fails_before_any_trial": "no data: exit 2",
    "tests/test_cli.py::test_a_config_mistake_is_one_line_exit_2_and_nothing_is_written": "exit 2 before Hydra",
    "tests/test_cli.py::test_experiment_with_or_without_plus_and_the_console_script": "--cfg job: prints the config",
    "tests/test_lm.py::test_cli_block_size_too_large_is_one_line_before_any_trial": "the length check: exit 2",
    "tests/test_public_api.py::test_the_command_prints_the_same_line_with_exit_2": "a config error: exit 2",
    "tests/test_stop.py::test_a_second_sweep_on_a_held_out_dir_is_refused_with_one_line": "out_dir held: exit 2",
    "tests/test_sweep_tracking.py::test_unreachable_tracking_server_stops_before_any_trial": "no MLflow: exit 2",
}
# What starts or stops Ray for the whole machine (the `ray_cluster` lane, run alone): a `ray start` head (own disks,
# the autoscaler's) or `ray stop --force`. Not a cluster_utils cluster: a `ray` test beside one starts a Ray of its
# own (tests/conftest.py's RAY_ADDRESS=local), and a cluster_utils head stops only its own processes.
CLUSTER_STARTERS = (r"\bAutoscalingCluster\b", r"\bautoscaling_cluster\(", r"\bOwnDiskCluster\b",
                    r"\bray_stop\(", r"\bown_disk_cluster\b", r"[\"']start[\"'],\s*[\"']--head[\"']",
                    r"[\"']stop[\"'],\s*[\"']--force[\"']",
                    r"address=[\"']auto[\"']")  # joins whichever Ray it finds: another test's, beside it
CLUSTER_STARTER_CALLABLES = frozenset({
    "ray.cluster_utils.AutoscalingCluster",
    "sweep.testing.local_cluster.autoscaling_cluster", "sweep.testing.local_cluster.OwnDiskCluster",
    "sweep.testing.local_cluster.ray_stop", "tests.helpers.own_disks.OwnDiskSweeps",
})
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def ray_starting_tests(tests: Path = TESTS, cluster: bool = False) -> dict[str, str]:
    """Every test under ``tests`` that starts Ray (``cluster``: a cluster, or stops Ray), with why (this module
    names the starters: not one of them)."""
    from tests.helpers.lanes import Starters, ray_starting_tests as starting

    starters = (Starters(CLUSTER_STARTERS, CLUSTER_STARTER_CALLABLES, frozenset(), sweep_commands=False) if cluster
                else Starters(RAY_STARTERS, RAY_STARTER_CALLABLES, QUIET_COMMANDS))
    fixtures = [TESTS / "conftest.py", *sorted((TESTS / "helpers").glob("*.py"))]  # pytest_plugins' and conftest's
    if tests != TESTS:
        fixtures = [*sorted(tests.glob("conftest.py")), *fixtures]
    return starting(tests, starters, fixtures, skip=(Path(__file__),))


def unmarked_ray_tests(tests: Path = TESTS, stops_before_ray: dict[str, str] = STOPS_BEFORE_RAY) -> dict[str, str]:
    """Tests that start Ray without ``pytest.mark.ray``: under `make test`'s two xdist workers they would run
    beside a Ray test, whose ``ray stop --force`` ends their Ray mid-test (or they end its Ray)."""
    from tests.helpers.lanes import ray_test_ids

    marked = ray_test_ids(tests)
    return {test: why for test, why in ray_starting_tests(tests).items()
            if test not in marked and test not in stops_before_ray}


def unmarked_cluster_tests(tests: Path = TESTS) -> dict[str, str]:
    """Tests that start a cluster or stop Ray without ``pytest.mark.ray_cluster``: they would run beside a
    local-Ray test, ending its Ray (``ray stop --force``) or taking its ``ray.init()`` (a cluster's address)."""
    from tests.helpers.lanes import CLUSTER_MARK, ray_test_ids

    marked = ray_test_ids(tests, mark=CLUSTER_MARK)
    return {test: why for test, why in ray_starting_tests(tests, cluster=True).items() if test not in marked}


def test_every_test_that_starts_a_cluster_is_marked_ray_cluster(tmp_path: Path) -> None:
    from tests.helpers.lanes import CLUSTER_MARK, ray_test_ids

    assert unmarked_cluster_tests() == {}
    assert ray_test_ids(TESTS, mark=CLUSTER_MARK) <= ray_test_ids(TESTS)  # a cluster test is a Ray test too
    (tmp_path / "test_a.py").write_text(
        "import pytest\npytestmark = pytest.mark.ray\n\n\ndef test_local(local_ray):\n    pass\n\n\n"
        "def test_cluster(own_disk_cluster):\n    pass\n\n\n@pytest.mark.ray_cluster\n"
        "def test_marked():\n    from ray.cluster_utils import AutoscalingCluster\n    AutoscalingCluster()\n\n\n"
        "def test_autoscaler():\n    from ray.cluster_utils import AutoscalingCluster\n    AutoscalingCluster()\n\n\n"
        "def test_cluster_utils():\n    from ray.cluster_utils import Cluster\n    Cluster()\n")
    # a cluster_utils cluster is not one for the whole machine (tests/test_ray_of_its_own.py)
    assert sorted(unmarked_cluster_tests(tmp_path)) == [f"{tmp_path.name}/test_a.py::test_{name}"
                                                        for name in ("autoscaler", "cluster")]


def test_every_test_that_starts_ray_is_marked_ray() -> None:
    from tests.helpers.lanes import ray_test_ids

    assert unmarked_ray_tests() == {}
    starting, marked = ray_starting_tests(), ray_test_ids(TESTS)
    # the known Ray fixtures are found as such, and every exception still names a starter and is not marked
    assert {"tests/test_sweep_ray.py::test_gpu_packing_on_two_nodes", "tests/test_own_disks.py::"
            "test_a_node_that_lacks_the_data_is_named_when_shipping_is_off"} <= set(starting)
    assert [t for t in STOPS_BEFORE_RAY if t not in starting or t in marked] == []


def test_the_ray_check_can_fail(tmp_path: Path) -> None:
    """A planted unmarked Ray test is found (its own code, a module fixture, a helper, a shared fixture); a
    marked one passes; a Ray-free test beside them is not put in the Ray lane."""
    from textwrap import dedent

    from tests.helpers.lanes import RAY_GROUP, ray_test_ids, work_unit

    (tmp_path / "test_a.py").write_text(dedent("""
        import subprocess, sys
        import pytest
        from sweep.app import run

        @pytest.fixture(scope="module")
        def head():
            subprocess.run(["ray", "start", "--head"])
            yield

        def start_sweep():
            return subprocess.Popen([sys.executable, "-m", "sweep", "experiment=demo"])

        def test_head(head):
            pass

        def test_helper():
            start_sweep()

        def test_shared_fixture(local_ray):
            pass

        def test_run(tmp_path):
            run({}, tmp_path)

        @pytest.mark.ray
        def test_marked():
            import ray
            ray.init()

        def test_free():
            subprocess.run([sys.executable, "-m", "sweep", "serve", "--help"])
        """))
    (tmp_path / "test_b.py").write_text(dedent("""
        import pytest
        pytestmark = [pytest.mark.slow, pytest.mark.ray]

        def test_x(local_ray):
            pass
        """))
    where = f"{tmp_path.name}/test_a.py::"
    assert set(unmarked_ray_tests(tmp_path)) == {where + t for t in ("test_head", "test_helper", "test_shared_fixture",
                                                                    "test_run")}
    assert unmarked_ray_tests(tmp_path, {where + t: "" for t in ("test_head", "test_helper", "test_shared_fixture",
                                                                 "test_run")}) == {}
    ray_ids = ray_test_ids(tmp_path)
    assert ray_ids == {where + "test_marked", f"{tmp_path.name}/test_b.py::test_x"}
    assert work_unit(where + "test_free", ray_ids) == where + "test_free"
    assert work_unit(f"{tmp_path.name}/test_b.py::test_x[1-a]", ray_ids) == RAY_GROUP


def test_the_ray_mark_is_read_from_a_test_its_class_its_cases_or_its_module(tmp_path: Path) -> None:
    from textwrap import dedent

    from tests.helpers.lanes import ray_test_ids

    (tmp_path / "test_c.py").write_text(dedent("""
        import pytest
        from pytest import mark

        class TestA:
            pytestmark = [pytest.mark.ray]

            def test_m(self):
                pass

        @pytest.mark.ray
        class TestB:
            def test_n(self):
                pass

        class TestC:
            @mark.ray
            def test_o(self):
                pass

            def test_free(self):
                pass

        @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.ray)])
        def test_p(x):
            pass

        @pytest.mark.slow
        def test_slow():
            pass
        """))
    where = f"{tmp_path.name}/test_c.py::"
    assert ray_test_ids(tmp_path) == {where + t for t in ("TestA::test_m", "TestB::test_n", "TestC::test_o", "test_p")}


def test_the_cluster_tests_are_one_xdist_work_unit_and_the_others_spread() -> None:
    from tests.helpers.lanes import CLUSTER_MARK, RAY_GROUP, ray_test_ids, work_unit

    ray_ids, cluster_ids = ray_test_ids(TESTS), ray_test_ids(TESTS, mark=CLUSTER_MARK)
    assert {"tests/test_sweep_ray.py::test_two_tasks_three_seeds_end_to_end",
            "tests/test_sweep_ray.py::test_gpu_packing_on_two_nodes"} <= ray_ids - cluster_ids  # a cluster_utils one
    assert {"tests/test_submit.py::test_submit_and_follow_a_tiny_sweep",
            "tests/test_own_disks.py::test_an_mlflow_server_restarted_mid_sweep_loses_nothing"} <= cluster_ids
    assert work_unit("tests/test_submit.py::test_a_wrong_or_missing_token_is_one_line_within_10s[auth1-401]",
                     cluster_ids) == RAY_GROUP
    for own in ("tests/test_sweep_ray.py::test_a_killed_trial_is_retried_from_its_checkpoint[lora]",  # local Ray
                "tests/test_submit.py::test_entrypoint_quotes_each_override",  # a Ray module's Ray-free test
                "tests/test_cli.py::test_bad_input_is_one_clear_line_and_writes_nothing[args0-error]",
                "tests/test_serve.py::test_z"):
        assert work_unit(own, cluster_ids) == own


class FakeWorker:
    """What LoadScopeScheduling asks of an xdist worker: the indices it is sent, its shutdown."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


@pytest.mark.parametrize("seed", range(6))
def test_local_ray_tests_run_two_at_a_time_and_cluster_tests_alone_after_them(seed: int) -> None:
    """The scheduler as xdist's controller drives it, the workers finishing in a random order: a worker runs its
    first pending test once it knows the next (or is shutting down). The local-Ray tests run on both workers at
    once; no cluster test runs until every local-Ray test has finished; the cluster worker is sent no other test
    while 2 or more cluster tests are left; every test is sent once and the run never stalls."""
    import random
    from types import SimpleNamespace

    from tests.helpers.lanes import ray_lane_scheduling

    collection = ["tests/test_a.py::test_free0", "tests/test_b.py::test_r1[x]", "tests/test_b.py::test_c1",
                  "tests/test_b.py::test_r1[y]", "tests/test_c.py::test_r2", "tests/test_c.py::test_c2",
                  "tests/test_c.py::test_r3", "tests/test_c.py::test_c3",
                  *(f"tests/test_d.py::test_free{i}" for i in range(1, 9))]
    ray_ids = {"tests/test_b.py::test_r1", "tests/test_c.py::test_r2", "tests/test_c.py::test_r3",
               "tests/test_b.py::test_c1", "tests/test_c.py::test_c2", "tests/test_c.py::test_c3"}
    cluster_ids = {"tests/test_b.py::test_c1", "tests/test_c.py::test_c2", "tests/test_c.py::test_c3"}
    kind = {i: ("cluster" if "test_c" in n.split("::")[1] else "local" if "test_r" in n else "free")
            for i, n in enumerate(collection)}
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"], option=SimpleNamespace(loadscopereorder=False))
    sched = ray_lane_scheduling(config, SimpleNamespace(loadscopesched=lambda *args: None), ray_ids, cluster_ids)
    workers = [FakeWorker("gw0"), FakeWorker("gw1")]
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, collection)
    sched.schedule()
    done: set[int] = set()
    both_local = False
    rng = random.Random(seed)

    def runnable(worker: FakeWorker) -> int | None:
        pending = [i for i in worker.sent if i not in done]
        return pending[0] if pending and (len(pending) > 1 or worker.shutting_down) else None

    while len(done) < len(collection):
        heads = {w: runnable(w) for w in workers}
        both_local |= all(h is not None and kind[h] == "local" for h in heads.values())
        ready = [w for w, h in heads.items() if h is not None]
        assert ready, f"stalled: sent {[w.sent for w in workers]}, done {sorted(done)}"
        worker = rng.choice(ready)
        index = heads[worker]
        if kind[index] == "cluster":
            assert all(kind[i] != "local" or i in done for i in range(len(collection))), "a local-Ray test left"
            left = [i for i in worker.sent if kind[i] == "cluster" and i not in done]
            later = worker.sent[worker.sent.index(index) + 1:]
            assert len(left) < 2 or all(kind[i] == "cluster" for i in later), "sent beside 2+ cluster tests"
        done.add(index)
        sched.mark_test_complete(worker, index)
    assert both_local
    assert sorted(workers[0].sent + workers[1].sent) == list(range(len(collection))) and not sched.has_pending


def cross_imports(root: Path = ROOT) -> list[str]:
    """``scripts/`` and ``tests/`` never import each other (what both use is in sweep/testing/): 'file -> module'
    for every import of ``tests`` under scripts/ and of ``scripts`` under tests/."""
    return sorted(f"{path.relative_to(root).as_posix()} -> {name}"
                  for folder, other in (("scripts", "tests"), ("tests", "scripts"))
                  for path in (root / folder).rglob("*.py")
                  for name in imports_of(path) if name == other or name.startswith(f"{other}."))


def test_scripts_and_tests_never_import_each_other(tmp_path: Path) -> None:
    assert cross_imports() == []
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "scripts" / "bench.py").write_text("def main():\n    from tests.helpers.s3 import s3_env\n")
    (tmp_path / "tests" / "test_x.py").write_text("import scripts.chaos\nfrom sweep.testing import services\n")
    assert cross_imports(tmp_path) == [
        "scripts/bench.py -> tests.helpers.s3", "scripts/bench.py -> tests.helpers.s3.s3_env",
        "tests/test_x.py -> scripts.chaos"]


def test_a_nodes_staging_task_imports_no_tune() -> None:
    """Each node's staging task imports sweep.cluster.stage_nodes in a fresh Ray worker: Tune's import
    (~1 CPU-second) would be all it pays for."""
    import subprocess
    import sys

    check = "import sys, sweep.cluster.stage_nodes; print(sorted(m for m in sys.modules if m.startswith('ray.tune')))"
    printed = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "[]", printed


def test_few_flat_modules() -> None:
    """Beside the packages only the small single-job helpers (``BASE``, at most 8) and the entry points:
    a module that does a package's job lives in that package."""
    flat = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "app"))
    assert flat == sorted(BASE) and len(flat) <= 8, f"sweep/*.py: {flat}: move what is not a helper to its package"


# ---- the public API is sweep.__all__ (docs/api.md): the docs use nothing else -------------------------

PUBLIC_DOCS = (PACKAGE.parent / "README.md", *sorted((PACKAGE.parent / "docs").glob("*.md")))


def non_public_uses(code: str, public: set[str]) -> list[str]:
    """What a snippet takes from sweep beyond ``public``: a submodule imported, a name not in it."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("sweep.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sweep":
            names = [node.module] if node.module != "sweep" else [f"sweep.{a.name}" for a in node.names]
            found += [n for n in names if n.removeprefix("sweep.") not in public]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sweep":
            found += [f"sweep.{node.attr}"] if node.attr not in public else []
    return found


def python_blocks(text: str) -> list[str]:
    import re

    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_docs_python_uses_only_the_public_api() -> None:
    import sweep

    found = [f"{path.name}: {use}" for path in PUBLIC_DOCS for block in python_blocks(path.read_text())
             for use in non_public_uses(block, set(sweep.__all__))]
    assert found == []
    assert any("sweep.run(" in b for b in python_blocks((PACKAGE.parent / "docs" / "api.md").read_text()))


def test_the_public_check_can_fail() -> None:
    code = ("import sweep\nimport sweep.app\nfrom sweep.config.validate import compose\n"
            "from sweep import run, app\nsweep.errors")
    assert non_public_uses(code, {"run"}) == ["sweep.app", "sweep.config.validate", "sweep.app", "sweep.errors"]


def test_the_public_names_are_all_and_each_resolves_to_its_home() -> None:
    import importlib

    import sweep

    homes = vars(sweep)["_HOMES"]  # the package's own table (not an import of a private name)
    assert sorted(sweep.__all__) == sorted(homes) == sorted(set(sweep.__all__))
    for name, home in homes.items():
        assert getattr(sweep, name) is getattr(importlib.import_module(home), name), name
