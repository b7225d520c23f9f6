"""Planning a sweep, in plain Python (no Ray; torch only inside the functions that count parameters or time steps).

- ``costs.py``:       each trial's predicted loop seconds from what it trains (rows, epochs, evaluations, method)
- ``probe.py``:       a few real training steps timed on this CPU, where the trials run beside the driver
- ``cpu_load.py``:    the machine's other work, measured while probing, and the trials' share of the CPU beside it
- ``eta.py``:         the remaining time: predicted loops and start-ups, then the trials' observed pace
- ``makespan.py``:    the cost model, GPU shares per task ("auto") and a simulated dispatch (the makespan)
- ``dispatch.py``:    each task's GPUs per trial and the longest-first order of the trials
- ``cpus.py``:        the CPUs a process may use as the kernel enforces them (affinity, cgroup quota)
- ``sizes.py``:       what one trial needs and how many run at once on the cluster
- ``scale.py``:       what an autoscaling cluster can grow to, the node wait and its texts
- ``rungs.py``:       the rung rules: a ranking without ties, ASHA's cut, seed halving's verdicts
- ``rung_boards.py``: the rungs boards per task (ASHA, seed halving) the trials ask after each evaluation
- ``task_studies.py``: sweep.search_alg=optuna: a TPE study per task, its state for a resumed driver
"""
