"""Training without Ray: the loop one trial runs, its model and metrics, and the no-Ray baseline.

- ``loop.py``:         ``finetune``: tokenized data -> a trained model, evaluated at each evaluation point
- ``evaluate.py``:     one split's metrics from a model (``evaluate``), and the autocast training shares
- ``lora.py``:         LoRA / QLoRA through PEFT: adapters on the frozen base, target checks, the merged export
- ``loading.py``:      a model folder -> tokenizer and model with the task's head; the device
- ``metrics.py``:      GLUE metrics, perplexity, the selection score and the trivial (best constant answer) score
- ``soup_weights.py``: seeds' checkpoints averaged into one (LoRA: the mean of B·A as one adapter; full: the weights)
- ``sequential.py``:   every trial one after another in this process (the baseline the benchmarks compare to)
- ``tiny_exports.py``: tiny untrained models in the layout a sweep exports (tests, the serving benchmark, a demo)
"""
