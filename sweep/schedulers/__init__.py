"""Schedulers and searchers: which trials run, in what order, and which stop early.

- ``policies.py``:    each sweep.scheduler / sweep.search_alg as one object (``policies_for``), which the others ask
- ``gate.py``:        Tune's trial generator in dispatch order, shut while a DDP trial places its workers
- ``search_space.py``: a sweep.search / sweep.pbt.mutations dimension as Tune's domain
- ``optuna_search.py``: sweep.search_alg=optuna: Tune's searcher over plan/task_studies, same order and gate
- ``seed_halving.py``: Tune's side of seed halving: pause a trial at the rung until its task is decided
- ``pbt.py``:         sweep.scheduler=pbt: Tune's PopulationBasedTraining, one population per task
"""
