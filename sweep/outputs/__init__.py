"""The end of a sweep as ordered steps: what happens once Tune's run is over (no Ray).

- ``steps.py``:    ``Outcome`` (what the steps share), ``Step`` (a name, required or best-effort, ``run``), and
                   ``run_steps``, the one place that applies the error and print policy
- ``end.py``:      ``end_of_sweep``: the steps in their order, built from the sections each one reads
- ``soup.py``:     sweep.soup: the best point's seeds averaged, exported to out_dir/soup/<task>, scored on both splits
- ``export.py``:   the best model per task into out_dir/best/<task> (a copy, or a LoRA adapter merged)
- ``reports.py``:  trivial scores, results files and the summary, expected max, importance, the closing lines
- ``publish.py``:  the sweep's end in MLflow, the uploads to storage.output_prefix, the end in the ledger and
                   the checkpoints pruned
- ``trivial.py``:  each task's trivial score from its eval labels, on the driver (results/chance judges it)
- ``glue_submission.py``: the best models' predictions of GLUE's test splits -> ``glue_submission.zip``
"""
