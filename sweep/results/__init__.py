"""What a sweep leaves: the records of its trials, the best per task, and the files people read.

- ``records.py``: ``TrialRecord``, the best per task, results.json / results.csv and the summary
- ``report.py``:  the plot of every trial's score per task
"""
