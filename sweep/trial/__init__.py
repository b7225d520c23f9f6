"""What runs in a trial's process (a Tune trial actor on any node).

- ``train_fn.py``:    one trial: the Tune function (``train_driver_fn``) running a TorchTrainer whose
                      workers run ``train_fn_per_worker`` with a typed ``TrialContext``
- ``tune_reports.py``: a DDP trial's Train reports, passed to Tune by the trainable's own thread
- ``kept_checkpoints.py``: a restored trial whose saved checkpoint a kill left deleted goes on from its newest whole one
"""
