"""What names a tiny model's build (``model.builder``) without building one: the keys it takes and the
recipe's version, read by ``local_folder`` to find a built folder in the cache. Kept apart from
``tiny.py``, whose torch and transformers imports cost seconds in every process that only looks."""

ARCHS = ("roberta", "gpt2", "bert")
BUILDER_KEYS = ("arch", "vocab_size", "hidden_size", "num_layers", "num_heads", "max_positions")
# Part of the cache key: bump when the build recipe (corpus, tokenizer, config) changes.
BUILD_RECIPE = 1
