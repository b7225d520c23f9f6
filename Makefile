# The two commands of README.md. Each creates (or reuses) the virtualenv in .venv,
# installing torch FIRST (torch==2.13.0 is the CPU wheel on these machines; a bare `torch`
# would pull a multi-GB CUDA build), then this package with its dev and openai extras, then vLLM
# alone (--no-deps): KServe's OpenAI endpoints take their request types from it, but its own
# requirements (torch==2.11, a CUDA stack) are for its engine, which the server never runs.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
VLLM ?= vllm==0.24.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,openai]"
	$(PY) -m pip install -q --no-deps "$(VLLM)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m sweep experiment=demo $(ARGS)

# The linter first (ruff, configured in pyproject.toml): a finding fails the target before any test runs.
# Two xdist workers: the test modules marked `ray` run one at a time on one of them (tests/conftest.py's
# scheduler), the Ray-free ones beside them.
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=25 $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
