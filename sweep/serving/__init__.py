"""Plain logic of the model server (``python -m sweep.serve``), testable without a server.

- ``source``:     where the model comes from (folder, ``models:/name@alias``, ``s3://``) and its name
- ``protocol``:   Open Inference Protocol v2 requests -> validated, typed requests (or a clear error)
- ``batcher``:    the asyncio micro-batcher that merges concurrent requests into one forward pass
- ``engines``:    the loaded classifier / causal LM and one batched forward pass each
- ``generation``: what a generated sequence becomes: text cut at a stop sequence, token counts
- ``cli_args``:   ``key=value`` command-line arguments
"""
