"""Sources -> a folder on each node: S3 objects and local folders, staged once per node. No Ray.

- ``s3.py``:         the S3 client (retries, clear errors), describe / fetch / upload of objects and prefixes
- ``archive.py``:    pack a folder as .tgz; unpack one safely (no absolute paths, ``..`` or links out)
- ``node_cache.py``: a pinned object version downloaded and unpacked at most once per node
- ``staging.py``:    the sweep's sources: the driver's preflight (pins), a node's ``ensure_local``
- ``hub.py``:        the Hugging Face Hub: a repo's revision pinned to a commit on the driver, fetched once per node
                    into the Hugging Face cache (offline: the cache's copy); its refusals as one line
- ``hub_files.py``:  which files of a Hub repo a sweep needs (config, tokenizer, safetensors; a task's parquet splits)
- ``hub_sources.py``: the sweep's Hub sources (the model's repo, each task's dataset) as pins, fetched on a node
- ``hub_data.py``:   the data folder built from the Hub's snapshots (GLUE configs linked, WikiText rows as text)
- ``shipping.py``:   the driver's own folders (storage=local) packed for, and unpacked on, nodes that lack them
- ``folder_upload.py``: pack and upload folders the way ``storage=s3`` reads them (the command: ``sweep upload``)

The MLflow store's copies to S3 are tracking's (sweep/tracking/store_upload.py, store_copies.py), on ``s3.py``.
"""
