"""The defaults more than one place needs, each in one home: the cache folder, the MLflow store, and the
environment of an ``mlflow server`` that sweep starts.

conf/ keeps the same values for its readers (``storage.cache_dir``, ``tracking.uri``);
tests/test_config.py checks that the YAML and these agree. Plain Python: anything may import it.
"""

from __future__ import annotations

import os

CACHE_DIR_ENV = "SWEEP_CACHE_DIR"  # a machine's cache folder (conf/storage/*.yaml's oc.env)
STORE_FILE = "runs/mlflow.db"  # the embedded store, in the folder of the README's sweeps (sweep/config/store_home.py)
LEGACY_STORE_FILE = "mlflow.db"  # where it was before: still used in a folder that holds one
TRACKING_URI = f"sqlite:///{STORE_FILE}"  # relative to the working folder (conf/tracking/mlflow.yaml)


def default_cache_dir() -> str:
    """``$SWEEP_CACHE_DIR``, else ``~/.cache/sweep``: what conf/storage/*.yaml's ``cache_dir`` resolves to."""
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return os.environ.get(CACHE_DIR_ENV) or f"{home}/.cache/sweep"


def mlflow_server_env() -> dict[str, str]:
    """The environment of an ``mlflow server`` that sweep starts (``sweep ui``'s; the tests' tracking servers)."""
    env = dict(os.environ)
    # Nothing of sweep's needs MLflow's background jobs (GenAI judges, trace roll-ups): without them
    # mlflow server is two processes, not ten, and starts on a third of the CPU. A person's own setting wins.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env
