# The two commands of README.md. Each creates (or reuses) the virtualenv in .venv,
# installing torch FIRST (torch==2.13.0 is the CPU wheel on these machines; a bare `torch`
# would pull a multi-GB CUDA build), then this package with its dev extra.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m sweep experiment=demo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
