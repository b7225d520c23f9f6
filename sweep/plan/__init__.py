"""Planning a sweep, in plain Python (no Ray; torch only inside the functions that count parameters).

- ``costs.py``:       each trial's predicted one-GPU seconds from the staged data and the model's size
- ``makespan.py``:    the cost model, GPU shares per task ("auto") and a simulated dispatch (the makespan)
- ``dispatch.py``:    each task's GPUs per trial and the longest-first order of the trials
- ``sizes.py``:       what one trial needs and how many run at once on the cluster
- ``scale.py``:       what an autoscaling cluster can grow to, the node wait and its texts
- ``rungs.py``:       the rung rules: a ranking without ties, ASHA's cut, seed halving's verdicts
- ``rung_boards.py``: the rungs boards per task (ASHA, seed halving) the trials ask after each evaluation
- ``task_studies.py``: sweep.search_alg=optuna: a TPE study per task, its state for a resumed driver
"""
