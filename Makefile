# The two commands of README.md. Each creates (or reuses) the virtualenv in .venv,
# installing torch pinned (torch==2.13.0 is the CPU wheel on these machines, in pip's find-links; a bare
# `torch` would pull a multi-GB CUDA build) with this package and its dev and openai extras, then vLLM
# alone (--no-deps): KServe's OpenAI endpoints take their request types from it, but its own
# requirements (torch==2.11, a CUDA stack) are for its engine, which the server never runs.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
VLLM ?= vllm==0.24.0
UV ?= uv==0.13.9
PY := $(VENV)/bin/python
# The rest with uv, which resolves the same versions as pip (pip freeze compared): a fresh `make install`
# took 71 s instead of 145 s. --compile-bytecode as pip does: these machines set PYTHONDONTWRITEBYTECODE,
# so a module left uncompiled is compiled again in every process (import torch+transformers+ray+mlflow:
# 15.3 s instead of 8.3). uv reads no pip.conf: it is given pip's find-links (these machines: the folder
# holding the CPU torch wheel), so torch comes from where pip would take it (pip then uv: 26 + 43 s;
# uv alone: 2 + 53 s).
FIND_LINKS := $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_PIP := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(addprefix --find-links ,$(FIND_LINKS))
STAMP := $(VENV)/.installed

.PHONY: demo test docs install clean

install: $(STAMP)

# A Chromium for the UI tests (tests/test_mlflow_ui.py, tests/helpers/browser.py): Playwright (dev extra)
# drives Debian's `chromium` via executable_path, since `playwright install` cannot download its own
# browsers here. Installed with apt-get when missing (as root); otherwise a line says what to install
# (those tests skip without it).
$(STAMP): pyproject.toml
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
	      || echo "WARNING: apt-get install chromium failed: the MLflow UI tests will skip"; \
	  else \
	    echo "NOTE: no chromium: install Debian's (sudo apt-get install --no-install-recommends chromium) for the MLflow UI tests"; \
	  fi; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(UV)"
	$(UV_PIP) "$(TORCH)" -e ".[dev,openai]"
	$(UV_PIP) --no-deps "$(VLLM)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m sweep experiment=demo $(ARGS)

# The linter first (ruff, configured in pyproject.toml): a finding fails the target before any test runs.
# Two xdist workers (tests/conftest.py's scheduler, tests/helpers/lanes.py): first the tests marked `ray` (each
# starts a Ray of its own: a local one, a cluster_utils cluster) two at a time with the Ray-free ones; then
# those also marked `ray_cluster` (a `ray start` head, a `ray stop --force`) one at a time on one worker, the
# Ray-free tests left on the other.
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=25 $(ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor, or a page left
# out of the nav, fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# What sweeps leave in this folder: Hydra's run folders, the README's out_dirs and the MLflow store in runs/
# (and the store an earlier version kept here), with the test and docs builds.
clean:
	rm -rf outputs multirun runs mlflow.db mlartifacts .pytest_cache site
