"""Files -> tokenized batches, on the node where a trial runs. Plain Python, PyTorch and datasets; no Ray.

- ``task_files.py``: where a task's files are and whether all are there (no datasets, no torch: the cheap checks)
- ``glue.py``:      GLUE tasks (TSV, save_to_disk or hub parquet layouts) -> DatasetDict; tokenization
- ``lm.py``:        causal-LM corpora (WikiText, folders of .txt) -> fixed-size token blocks
- ``cache.py``:     the per-node cache of tokenized datasets, keyed by content (built once, under a lock)
- ``collate.py``:   rows -> padded tensors (classification and LM collators), token counts
- ``synthetic.py``: generated GLUE-layout and WikiText-layout data (the demo's and the tests')
- ``selection.py``: the selection split (sweep.selection): the rows every decision is made on, apart from the
                  rows the chosen trial's score is reported on
"""
