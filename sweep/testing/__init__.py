"""Services and clusters for the tests and the scripts (not part of the public API).

- ``local_cluster.py``: multi-node Ray clusters on one machine (nodes with their own disks: ``unshare -m``
                      + tmpfs; the fake-provider autoscaling cluster), ``free_port``
- ``services.py``:    a moto S3 server and an MLflow tracking server as processes, for tests, benchmarks and chaos
- ``stand_in_hub.py``: a stand-in Hugging Face Hub on 127.0.0.1 (the routes huggingface_hub and datasets call), held
                      in memory, counting each file's downloads
- ``hub_repos.py``:   the repos the Hub tests and bench_hub.py serve from it: a roberta-base-shaped model, GLUE tasks
                      in nyu-mll/glue's parquet layout, a gated and a private repo
- ``random_kills.py``: a sweep killed whole (driver, every Ray process, the head's disk) at random instants and at
                      S3 uploads, rerun each time, then checked: every trial ended exactly once
"""
