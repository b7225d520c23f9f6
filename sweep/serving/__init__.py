"""The model server (``sweep serve``) and its client (``sweep infer``); their command lines are in sweep/cli/.

- ``server.py``:      ``ServeOptions`` -> a model source -> a KServe ModelServer (the command: sweep/cli/serve.py)
- ``kserve_model.py``: the kserve.Model subclasses that answer the Open Inference Protocol
- ``openai_model.py``: the causal LM over KServe's OpenAI endpoints too (completions, chat, streaming)
- ``adapter_pool.py``: many LoRA adapters on one base (``adapters=``): each its own model name and micro-batch queue
- ``routes.py``:      every HTTP route the server answers (one table) and the app built from it
- ``client.py``:      one inference call to a running server (the command: sweep/cli/infer.py)

- ``model_location.py``: where the model comes from (folder, ``models:/name@alias``, ``s3://``) and its name
- ``protocol.py``:   Open Inference Protocol v2 requests -> validated, typed requests (or a clear error)
- ``openai_protocol.py``: OpenAI completion / chat requests -> the same typed settings (or a clear error)
- ``batcher.py``:    the asyncio micro-batcher that merges concurrent requests into one forward pass
- ``continuous.py``: continuous batching of a causal LM: every generation joins one running batch
- ``decoding_process.py``: the batch's decoding process as the server sees it (spawn, commands, messages)
- ``decoding_engine.py``: inside that process: the model, transformers' batch manager, each step's outputs sent
- ``held_outputs.py``: a stream's outputs held within ``stream_interval_ms``, the newest per sequence sent once
- ``cpu_budget.py``: the CPUs the server may use (affinity, cgroup quota) and the torch threads that follow
- ``admission.py``:  at most N sequences generating and M waiting; past them, 429 (``Overloaded``)
- ``guards.py``:     what guards every request (key, body limit, deadline) as the app's middleware
- ``api_key.py``:    ``api_key=`` / ``$SWEEP_API_KEY``: POST routes and gRPC inference need the bearer key; else 401
- ``body_limit.py``: ``max_body_bytes=``: a body past it is 413 before it is read
- ``deadline.py``:   ``request_timeout_s=``: a request past it is cancelled, 504
- ``asgi_errors.py``: an error those middlewares answer: the route family's body, one WARNING line
- ``engines.py``:    the loaded classifier / causal LM and one batched forward pass each
- ``model_kind.py``: what a model folder holds (classifier or causal LM), from its config.json alone
- ``generation.py``: what a generated sequence becomes: text cut at a stop sequence, token counts
- ``server_metrics.py``: the ``sweep_`` Prometheus metrics on ``GET /metrics``
- ``request_log.py``: one log line per HTTP request: the access line, or a 4xx's one WARNING with its reason
- ``call_log.py``:   one log line per gRPC call, and the WARNING of a message over ``max_body_bytes``
- ``third_party_logs.py``: third-party start-up lines nobody can act on, filtered by their exact words
- ``kserve_import.py``: import kserve without it reading our ``sys.argv``
"""
