"""The two lanes of ``make test`` (``pytest -n 2``; tests/conftest.py hands this scheduler to pytest-xdist).

A test that starts Ray (``ray.init``, a ``cluster_utils`` cluster, a sweep in-process or as ``python -m
sweep``) is marked ``ray``: ``@pytest.mark.ray`` on the test or its class, or a module's ``pytestmark`` where
every test of the module starts Ray. Two such tests run side by side, each with a Ray of its own. A test that
starts or stops Ray for the whole machine (a ``ray start`` head, ``ray stop --force``, which ends every Ray
process on it; the autoscaler's cluster) is also marked ``ray_cluster``: those are in ONE xdist work unit,
run last, one at a time, with no other Ray test beside them (``ray_lane_scheduling``).

The marks are read from the source (AST), not from pytest's items: xdist's scheduler runs in the controller,
which has only the workers' node ids. tests/test_architecture.py checks that every test that starts Ray is
marked, and every one that starts or stops it for the machine is marked ``ray_cluster``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY_MARK = "ray"  # starts Ray of its own (ray.init, a sweep, a cluster_utils cluster) or, with CLUSTER_MARK, a cluster
CLUSTER_MARK = "ray_cluster"  # starts or stops Ray for the whole machine: such tests run alone, one at a time
RAY_OF_ITS_OWN = "local"  # RAY_ADDRESS of a `ray` test that is not a `ray_cluster` one (tests/conftest.py)
RAY_GROUP = "ray-cluster"  # the one xdist work unit of every test marked `ray_cluster`


def is_ray_mark(node: ast.AST, mark: str = RAY_MARK) -> bool:
    """``pytest.mark.<mark>`` (or ``mark.<mark>``), called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    if not (isinstance(node, ast.Attribute) and node.attr == mark):
        return False
    owner = node.value
    return ((isinstance(owner, ast.Attribute) and owner.attr == "mark")
            or (isinstance(owner, ast.Name) and owner.id == "mark"))


def holds_ray_mark(nodes: list[ast.expr], mark: str = RAY_MARK) -> bool:
    """A ``mark`` anywhere in these expressions: a decorator, a ``pytestmark`` list, a
    ``pytest.param(..., marks=pytest.mark.ray)`` (the whole test then: the lane is per test, not per case)."""
    return any(is_ray_mark(n, mark) for node in nodes for n in ast.walk(node))


def pytestmark_values(body: list[ast.stmt]) -> list[ast.expr]:
    """What ``pytestmark = ...`` assigns in a module's or a class's body."""
    values = []
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets):
            values.append(stmt.value)
        elif (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "pytestmark"
              and stmt.value is not None):
            values.append(stmt.value)
    return values


def is_test_function(node: ast.stmt) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")


def tests_in(module: ast.Module,
             mark: str = RAY_MARK) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """Each test of a module as pytest names it after the file (``test_x`` or ``TestY::test_x``), its
    function, and whether it is marked ``mark`` (itself, its class or its module)."""
    module_marked = holds_ray_mark(pytestmark_values(module.body), mark)
    for node in module.body:
        if is_test_function(node):
            yield node.name, node, module_marked or holds_ray_mark(node.decorator_list, mark)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            class_marked = module_marked or holds_ray_mark(node.decorator_list + pytestmark_values(node.body), mark)
            for item in node.body:
                if is_test_function(item):
                    yield f"{node.name}::{item.name}", item, class_marked or holds_ray_mark(item.decorator_list, mark)


def modules_under(tests: Path) -> list[Path]:
    return sorted(tests.rglob("test_*.py"))


def ray_test_ids(tests: Path, prefix: str | None = None, mark: str = RAY_MARK) -> set[str]:
    """The node ids, less parametrization, of the tests marked ``mark`` under ``tests``: ``tests/test_x.py::test_y``
    (``prefix``: the folder's path from pytest's rootdir, by default its name)."""
    prefix = tests.name if prefix is None else prefix
    ids = set()
    for path in modules_under(tests):
        try:
            module = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError:  # pytest reports it when it collects the file: no test of it runs
            continue
        where = f"{prefix}/{path.relative_to(tests).as_posix()}"
        ids |= {f"{where}::{name}" for name, _, marked in tests_in(module, mark) if marked}
    return ids


def work_unit(nodeid: str, cluster_ids: set[str]) -> str:
    """A test's xdist work unit: every test that starts a cluster (``cluster_ids``, whatever its parameters) is
    in one unit, run alone; any other test is a unit of its own."""
    return RAY_GROUP if nodeid.split("[", 1)[0] in cluster_ids else nodeid


def ray_lane_scheduling(config, log, ray_ids: set[str], cluster_ids: set[str]):
    """xdist's LoadScopeScheduling over ``work_unit``'s units, in two phases.

    1. The tests that start a Ray of their own (``ray_ids`` less ``cluster_ids``: ``ray.init``, a sweep, a
       ``cluster_utils`` cluster) run on both workers, two at a time: two Rays live side by side (each its
       own GCS, ports and session; RAY_ADDRESS=local keeps a plain ``ray.init()`` from joining the
       ``cluster_utils`` head beside it), and two tiny sweeps on 2 cores take about 1.4x one's time, not 2x.
       Ray-free tests fill in.
    2. Once every such test has finished, the cluster tests (a ``ray start`` head, ``ray stop --force``, the
       autoscaler's cluster) run one at a time on one worker,
       and the Ray-free tests left run on the other: a ``ray stop --force`` ends every Ray process on the
       machine, so nothing else of Ray may run then.

    LoadScopeScheduling gives each worker one unit, then one more whenever it has 2 or fewer tests pending.
    A worker runs a test only once it knows the next one (or that none comes), for the fixtures' teardown:
    so the cluster unit may follow a worker's own last local-Ray test (it runs after it, on that worker), but
    never one still pending on the other worker; and while it has 2 or more cluster tests left, its worker
    takes nothing else.
    """
    from xdist.scheduler import LoadScopeScheduling

    def base(nodeid: str) -> str:
        return nodeid.split("[", 1)[0]

    class RayLaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, cluster_ids)

        def is_local_ray(self, scope: str) -> bool:
            return scope != RAY_GROUP and base(scope) in ray_ids

        def local_ray_left_beside(self, node) -> bool:
            """A local-Ray test not finished on another worker (or not handed out yet)."""
            if any(self.is_local_ray(scope) for scope in self.workqueue):
                return True
            return any(not done for other, units in self.assigned_work.items() if other is not node
                       for scope, tests in units.items() if self.is_local_ray(scope) for done in tests.values())

        def next_unit(self, node) -> str | None:
            """The unit ``node`` gets now, or None: it waits."""
            queue = list(self.workqueue)
            local = [s for s in queue if self.is_local_ray(s)]
            if local:
                return local[0]
            free = [s for s in queue if s != RAY_GROUP]
            if RAY_GROUP in queue and not self.local_ray_left_beside(node):
                return RAY_GROUP
            return free[0] if free else None

        def _assign_work_unit(self, node) -> None:
            scope = self.next_unit(node)
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            cluster_left = list(self.assigned_work.get(node, {}).get(RAY_GROUP, {}).values()).count(False)
            if cluster_left > 1 and self.workqueue and not node.shutting_down:
                return
            super()._reschedule(node)

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            for other in self.nodes:  # a worker that waited for this one's last local-Ray test may go on
                if other is not node:
                    self._reschedule(other)

    return RayLaneScheduling(config, log)


# ------------------------------------------------------------------------------------------ what starts Ray
# (tests/test_architecture.py: every test that starts Ray is marked `ray`)


@dataclass(frozen=True)
class Starters:
    """What starts Ray in a test's code: ``patterns`` (regexes over its source), ``callables`` (qualified
    names: a test using one imported by ``from M import name`` starts Ray), ``quiet_commands``
    (``python -m sweep COMMAND``: the commands that start no Ray; any other ``[..., "-m", "sweep", ...]``
    command list runs a sweep, unless it asks for ``--help`` or ``--cfg``)."""

    patterns: tuple[str, ...]
    callables: frozenset[str]
    quiet_commands: frozenset[str]
    quiet_flags: frozenset[str] = frozenset({"--help", "-h", "--cfg"})
    sweep_commands: bool = True  # a `python -m sweep` command list is a starter (it starts a local Ray)


def is_fixture(node: ast.stmt) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                isinstance(target, ast.Name) and target.id == "fixture"):
            return True
    return False


def fixture_keyword(node: ast.FunctionDef | ast.AsyncFunctionDef, key: str):
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == key and isinstance(keyword.value, ast.Constant):
                    return keyword.value.value
    return None


@dataclass
class Module:
    """One source file: its text and tree, the names its ``from M import name`` bind to a Ray starter,
    its fixtures (by the name tests request) and its other top-level functions and classes."""

    path: Path
    text: str
    tree: ast.Module
    starter_names: dict[str, str] = field(default_factory=dict)
    fixtures: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    autouse: list[str] = field(default_factory=list)
    helpers: dict[str, ast.stmt] = field(default_factory=dict)
    _lines: list[str] | None = field(default=None, repr=False)

    @classmethod
    def read(cls, path: Path, starters: Starters) -> Module:
        text = path.read_text()
        module = cls(path, text, ast.parse(text, filename=str(path)))
        module.starter_names = imported_starters(module.tree.body, starters)
        for node in module.tree.body:
            if is_fixture(node):
                name = fixture_keyword(node, "name") or node.name
                module.fixtures[name] = node
                if fixture_keyword(node, "autouse"):
                    module.autouse.append(name)
            elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and not is_test_function(node) and not node.name.startswith("Test")):
                module.helpers[node.name] = node
        return module

    def source_of(self, node: ast.AST) -> str:
        """The lines of a top-level function or class (what ``ast.get_source_segment`` gives, without
        splitting the whole text again for every node: that was 27 of a full scan's 38 s)."""
        if self._lines is None:
            self._lines = self.text.split("\n")
        return "\n".join(self._lines[node.lineno - 1:node.end_lineno])


def imported_starters(statements: list[ast.stmt], starters: Starters) -> dict[str, str]:
    """local name -> qualified name, for each ``from M import name [as local]`` of a starter in these
    statements (a function's own imports included when a function is given)."""
    found = {}
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in starters.callables:
                        found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def sweep_command(node: ast.AST, starters: Starters) -> str | None:
    """The first ``[..., "-m", "sweep", X, ...]`` in ``node`` that runs a sweep (X not a quiet command,
    no --help or --cfg after it), as text."""
    for n in ast.walk(node):
        if not isinstance(n, (ast.List, ast.Tuple)):
            continue
        words = [e.value if isinstance(e, ast.Constant) else None for e in n.elts]
        for i in range(len(words) - 1):
            rest = n.elts[i + 2:]
            if words[i] != "-m" or words[i + 1] != "sweep" or not rest:
                continue  # a bare ["python", "-m", "sweep"]: a manifest's command checked, nothing run
            if any(isinstance(e, ast.Constant) and e.value in starters.quiet_flags for e in rest):
                continue
            if isinstance(rest[0], ast.Constant) and rest[0].value in starters.quiet_commands:
                continue
            return ast.unparse(n)[:80]
    return None


class RayStarts:
    """Why a test starts Ray: a starter in its own code, in a fixture it requests (its module's, then
    tests/conftest.py's and tests/helpers/'s, transitively) or in a top-level function or class of its
    module that it uses (transitively)."""

    def __init__(self, starters: Starters, fixture_modules: list[Path]):
        self.starters = starters
        self.patterns = [re.compile(p) for p in starters.patterns]
        self.shared: dict[str, tuple[Module, ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.shared_autouse: list[str] = []
        for path in fixture_modules:
            module = Module.read(path, starters)
            for name, node in module.fixtures.items():
                self.shared.setdefault(name, (module, node))
            self.shared_autouse += module.autouse

    def own(self, module: Module, node: ast.AST) -> str | None:
        text = module.source_of(node)
        for pattern in self.patterns:
            if found := pattern.search(text):
                return found.group()
        names = {**module.starter_names, **imported_starters([node], self.starters)}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in names:
                return f"{n.id} ({names[n.id]})"
        return sweep_command(node, self.starters) if self.starters.sweep_commands else None

    def requested(self, module: Module, node: ast.AST, is_test: bool) -> list[str]:
        """The fixtures a function asks for: its arguments, ``request.getfixturevalue("x")``,
        ``usefixtures`` marks; and for a test, every autouse fixture it gets."""
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names += [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            extra = list(node.decorator_list)
            if is_test:
                extra += pytestmark_values(module.tree.body)
            for n in [*ast.walk(node), *(m for e in extra for m in ast.walk(e))]:
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and n.func.attr in ("getfixturevalue", "usefixtures")):
                    names += [a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if is_test:
            names += module.autouse + self.shared_autouse
        return names

    def why(self, module: Module, node: ast.AST, is_test: bool = False, seen: frozenset = frozenset()) -> str | None:
        key = (module.path, getattr(node, "lineno", 0))
        if key in seen:
            return None
        seen = seen | {key}
        if reason := self.own(module, node):
            return reason
        for name in self.requested(module, node, is_test):
            local = module.fixtures.get(name)
            if local is not None and local is not node:
                where, fixture = module, local
            elif name in self.shared and self.shared[name][1] is not node:
                where, fixture = self.shared[name]
            else:
                continue
            if reason := self.why(where, fixture, seen=seen):
                return f"fixture {name}: {reason}"
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in module.helpers and module.helpers[n.id] is not node:
                if reason := self.why(module, module.helpers[n.id], seen=seen):
                    return f"{n.id}: {reason}"
        return None


def ray_starting_tests(tests: Path, starters: Starters, fixture_modules: list[Path], prefix: str | None = None,
                       skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every test under ``tests`` that starts Ray (ids as ``ray_test_ids`` gives them), with why."""
    prefix = tests.name if prefix is None else prefix
    starts = RayStarts(starters, fixture_modules)
    found = {}
    for path in modules_under(tests):
        if path in skip:
            continue
        module = Module.read(path, starters)
        where = f"{prefix}/{path.relative_to(tests).as_posix()}"
        for name, node, _ in tests_in(module.tree):
            if reason := starts.why(module, node, is_test=True):
                found[f"{where}::{name}"] = reason
    return found
