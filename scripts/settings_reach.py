"""How far the whole ``Settings`` travels in one sweep (issue 53): every call that receives it, traced in the
driver process while ``sweep.run`` runs the demo sweep (local Ray, the tiny model, synthetic rows).

    .venv/bin/python scripts/settings_reach.py [--tree PATH]

Prints: the functions in sweep/ that take a ``Settings`` (static count, by package); the calls that received
it; those that entered app.py; those that went back up a layer (the callee in a higher layer than its caller,
by the layers of the tree's tests/test_architecture.py). ``--tree``: another checkout to measure (a commit
before a change), run with this venv.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
import sys
import tempfile
import threading
from pathlib import Path


def static_count(package: Path) -> tuple[int, dict[str, int]]:
    """Functions with a parameter annotated ``Settings``, by the package (or flat module) they are in."""
    per: collections.Counter[str] = collections.Counter()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                if any(p.annotation is not None and ast.unparse(p.annotation).split("|")[0].strip(" '\"") == "Settings"
                       for p in params):
                    parts = path.relative_to(package).parts
                    per[parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")] += 1
    return sum(per.values()), dict(per.most_common())


def layers_of(tree: Path):
    spec = importlib.util.spec_from_file_location("tree_architecture", tree / "tests" / "test_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.layer_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    tree = parser.parse_args().tree.resolve()
    sys.path.insert(0, str(tree))
    import sweep

    assert Path(sweep.__file__).resolve().parent == tree / "sweep", sweep.__file__
    layer_of = layers_of(tree)
    counts = collections.Counter()

    def rank(module: str) -> int:
        try:
            return layer_of(module)
        except AssertionError:  # sweep/__init__ and the like: in no layer
            return -1

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("sweep"):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if not any(type(frame.f_locals.get(n)).__name__ == "Settings" for n in names):
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        counts["calls"] += 1
        counts["into app.py"] += module == "sweep.app" and caller != "sweep.app"
        if caller.startswith("sweep.") and rank(module) > rank(caller):
            counts["back up a layer"] += 1

    total, per = static_count(tree / "sweep")
    print(f"functions taking the whole Settings: {total} {per}")
    with tempfile.TemporaryDirectory() as out:
        settings = sweep.load_settings("experiment=demo", "tracking=none", "sweep.seeds=[1,2]", "train.epochs=1",
                                       out_dir=out)
        if tree != Path(__file__).resolve().parents[1]:  # Ray's workers import the same tree, not the venv's
            import ray

            ray.init(include_dashboard=False, runtime_env={"py_modules": [str(tree / "sweep")]})
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            sweep.run(settings)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    print("calls receiving it in the driver:", dict(counts))


if __name__ == "__main__":
    main()
