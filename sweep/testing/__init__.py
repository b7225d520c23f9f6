"""Services and clusters for the tests and the scripts (not part of the public API).

- ``local_cluster.py``: multi-node Ray clusters on one machine (nodes with their own disks: ``unshare -m``
                      + tmpfs; the fake-provider autoscaling cluster), ``free_port``
- ``services.py``:    a moto S3 server and an MLflow tracking server as processes, for tests, benchmarks and chaos
"""
