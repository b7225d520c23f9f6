"""What the test modules share (no test module imports another). Fixtures are registered once, by
``tests/conftest.py``'s ``pytest_plugins``: a test names them as arguments and imports none.

- ``configs.py``:   the one way tests compose the Hydra config (as ``python -m sweep`` would): the demo's
                    config and settings, a validated train recipe
- ``sweeps.py``:    ``sweep_cmd`` (``python -m sweep`` as a process), the ``local_ray`` fixture and
                    ``actors`` (the GCS's actor table: trial processes, Train workers)
- ``overlap.py``:   how many trials held their resources at once (from their spans)
- ``s3.py``:        the ``moto_server`` fixture (a real S3 endpoint over HTTP), ``s3_env``, a stager for
                    spawned processes; the services themselves are in ``sweep/testing/services.py``
- ``tracking.py``:  the ``mlflow_server`` fixture (one ``mlflow server`` for the session) and a trial's
                    tracking body for spawned processes
- ``own_disks.py``: the ``own_disk_cluster`` fixture: a cluster whose worker node has its own disk
                    (``sweep.testing.local_cluster``) and a sweep run on the head's side
- ``serving.py``:   real ``python -m sweep serve`` processes (start, wait, stop) and what the serving
                    tests share: the served names, the v2 request/response helpers, a recording model
- ``manifests.py``: the Kubernetes manifests' checks against the CRDs' schemas

Services and clusters the scripts use as well come from outside tests/: ``sweep.testing.local_cluster``
(Ray clusters on one machine, ``free_port``) and ``sweep.testing.services`` (moto_server, an mlflow server).
"""
