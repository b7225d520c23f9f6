"""The installed package carries its Hydra tree: a wheel built from this checkout, installed into a
fresh virtualenv outside it, composes the default config (conf/ ships as sweep/conf). The wheel holds
every package of sweep/ but ``sweep.testing`` (not public: docs/api.md), which a checkout still imports."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout (about 3 s), built from a copy: no build/ or egg-info left in the checkout,
    nor a stale build/ of it in the wheel."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("sweep", "conf"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, capture_output=True, text=True, timeout=300)
    return next(dist.glob("sweep-*.whl"))


def test_the_wheel_holds_every_package_but_sweep_testing(tmp_path: Path) -> None:
    shipped = {str(Path(n).parent) for n in zipfile.ZipFile(build_wheel(tmp_path)).namelist() if n.endswith(".py")}
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "sweep").glob("**/__init__.py")}
    assert "sweep/testing" in packages and not {p for p in shipped if p.startswith("sweep/testing")}
    assert packages - shipped == {"sweep/testing"}  # a new package is listed in pyproject.toml's packages
    # ... which the editable install (make install's: its finder maps the whole sweep/ folder) imports, from anywhere
    r = subprocess.run([sys.executable, "-c", "import sweep.testing.services as s; print(s.__file__)"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, check=True)
    assert Path(r.stdout.strip()).is_relative_to(ROOT / "sweep" / "testing")


def test_a_wheel_installed_elsewhere_composes_the_default_config(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    # The dependencies (hydra, omegaconf) come from this environment's site-packages, added as a
    # plain path: its .pth files (the editable install's finder) are not run, so `sweep` is the wheel's.
    fresh_site = next((venv / "lib").glob("python3*/site-packages"))
    (fresh_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    where = subprocess.run([str(py), "-c",
                            "import sweep, sweep.config.tasks as tasks; print(sweep.__file__); print(tasks.CONF_DIR)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where
    r = subprocess.run([str(py), "-m", "sweep", "--cfg", "job"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "WNLI:" in r.stdout and "name: roberta-base" in r.stdout
    r = subprocess.run([str(venv / "bin" / "sweep"), "experiment=demo", "--cfg", "job"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "name: tiny-roberta" in r.stdout, r.stderr
    # The console script is the whole command: its subcommands come with the wheel (sweep/cli/).
    r = subprocess.run([str(venv / "bin" / "sweep"), "submit", "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: sweep submit "), r.stderr
