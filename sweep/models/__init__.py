"""Where a model comes from, offline (below storage/, which stages it): no loading for training here.

- ``local_folder.py``: a model config -> a local folder (explicit path, staged copy, the tiny builder, a package)
- ``tiny.py``:   tiny RoBERTa / GPT-2 / BERT models and their tokenizers built from ``model.builder`` params
- ``tiny_recipe.py``: a tiny build's keys and recipe version, all a cache lookup needs (no torch)
- ``quiet.py``:  transformers' load reports and progress bars silenced around a load or save
"""
