"""Where a model comes from (below storage/, which stages it and fetches a Hub model): no loading for training here.

- ``local_folder.py``: a model config -> its source (explicit path, staged copy, the tiny builder, a package, the
                     Hub) and its local folder
- ``tiny.py``:   tiny RoBERTa / GPT-2 / BERT models and their tokenizers built from ``model.builder`` params
- ``tiny_recipe.py``: a tiny build's keys and recipe version, all a cache lookup needs (no torch)
- ``quiet.py``:  transformers' load reports and progress bars silenced around a load or save
"""
