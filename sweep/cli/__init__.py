"""The ``sweep`` command and its subcommands: each module reads one command line and calls the library
with plain values (nothing here is imported by the packages below).

- ``main.py``:      ``sweep COMMAND ...``: the dispatcher (``COMMANDS``); ``sweep <overrides>`` is ``sweep run``
- ``run.py``:       ``sweep run <overrides>``: the sweep, Hydra's app (the override check before Hydra writes)
- ``submit.py``:    ``sweep submit``: the sweep as a Ray Job on a running cluster; status, logs, stop, list
- ``serve.py``:     ``sweep serve key=value ...``: the model server's options (``OPTIONS``)
- ``infer.py``:     ``sweep infer``: one inference call to a model server (REST, gRPC or streamed)
- ``upload.py``:    ``sweep upload``: folders packed and uploaded to S3 for ``storage=s3``
- ``upload_mlflow.py``: ``sweep upload-mlflow``: a sqlite MLflow store and its artifacts to S3, by hand
- ``replay.py``:    ``sweep replay``: the MLflow calls a sweep kept, sent to a store
- ``ui.py``:        ``sweep ui``: MLflow's UI on a sweep's store (``mlflow server``), the URLs of its runs
- ``key_values.py``: ``key=value`` arguments (``sweep serve``'s) with one-line errors

``python -m sweep`` is ``sweep``; ``python -m sweep submit`` / ``serve`` / ``infer`` / ``upload`` (sweep/*.py)
are its subcommands, for the manifests, the image and scripts.
"""
