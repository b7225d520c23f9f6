"""The sweep's driver side of Ray: the plan before any trial and the ONE Tune run of every trial.

- ``tuner.py``:       one Tune run for every trial (or resume it): the trainable, callbacks, the Tuner, fit
- ``sweep_plan.py``:  the driver's ``SweepPlan`` before any trial: storage, every node staged, sizes, order, ETA
- ``tune_results.py``: Tune's results and the trials' histories -> one ``TrialRecord`` per trial; checkpoint folders
- ``extensions.py``: ``sweep.run``'s extension points (own scheduler policy, Tune callbacks, metrics) as one value
- ``stop.py``:        SIGTERM/SIGINT stop the sweep through Tune's own stop; the resume command line
"""
