"""Tune callbacks and hooks on the driver: what the sweep does as trials report, end or fail.

- ``progress.py``:    the one-line-per-change progress callback; the node wait
- ``mlflow_runs.py``: every trial's nested MLflow run, logged by the driver from the trials' reports
- ``ended_trials.py``: an ended trial's per-metric analysis (Tune's, never read) leaves the driver's memory
- ``lost_trials.py``: a trial whose process Ray ended (its memory monitor) is a failed trial, not a crashed Tune run
- ``disk_stop.py``:   a trial's full disk ends the sweep with its one line (resume=true finishes it)
- ``record_copies.py``: the MLflow records copied to storage.output_prefix while the sweep runs
- ``ledger_entries.py``: each trial's entry in the sweep's ledger, written at every change of its state
- ``resumed_search.py``: (a sweep begun before the ledger) its searcher set from the trials Tune restored
- ``staging_lines.py``: the nodes' staging lines (nodes that join late) on the driver's terminal
"""
