"""What a sweep leaves: the records of its trials, the best per task, and the files people read.

- ``records.py``: ``TrialRecord``, the best per task, results.json / results.csv and the summary
- ``outcome.py``: how the sweep ended: each failed trial's one line (the same reason once) and the exit code;
                 how a resumed sweep found its saved trials (``resuming_line``)
- ``intervals.py``: the mean's 95% bootstrap interval over seeds; two points compared paired by seed (sign-flip test)
- ``chance.py``:  did a task learn anything: its trivial score (``TrivialScore``) and the noise of its eval rows
- ``report.py``:  the plots: every trial's score per task, the expected best against the trials run
- ``expected_max.py``: E[best of n trials] and its sd: unbiased (Tang et al. 2020), or Dodge et al. 2019's
- ``importance.py``: which varied train key mattered, per task: fANOVA (Optuna) over the finished trials
- ``trial_reports.py``: the trial contract: the ``Report`` row a trial reports and keeps in its history file
- ``ledger.py``:  the sweep's own ledger: one entry per trial identity, what a resume runs; the driver's lease
- ``export_layout.py``: an exported model folder's layout (``MADE_BY``, the adapter folder, the registry name)
"""
