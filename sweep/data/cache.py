"""The per-node cache of tokenized datasets: ``cache_dir/tokenized/<key>``, built once under a lock.

GLUE tokens (glue.py) and LM blocks (lm.py) are both stored here; the key is a sha256 over
everything that changes the result (data fingerprints, the tokenizer's identity, lengths, format).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from datasets import DatasetDict, load_from_disk
from filelock import FileLock
from transformers import PreTrainedTokenizerBase

from sweep.disk import writing
from sweep.files import atomic_folder

log = logging.getLogger(__name__)


def content_key(*parts: object) -> str:
    """sha256 over the parts' text forms: the cache keys and dataset fingerprints."""
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()


@dataclass
class CacheStats:
    """How the cache was answered in this process (tests and benchmarks read it)."""

    hits: int = 0
    misses: int = 0


cache_stats = CacheStats()


def cached_dataset(cache_dir: str | Path, key: str, build: Callable[[], DatasetDict], what: str) -> DatasetDict:
    """``cache_dir/tokenized/<key>``, built once under a file lock (concurrent trials wait for it)."""
    root = Path(cache_dir) / "tokenized"
    target = root / key
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{key}.lock")):
        if target.is_dir():
            cache_stats.hits += 1
            log.info("%s: cache hit %s", what, target)
            return load_from_disk(str(target))
        cache_stats.misses += 1
        log.info("%s: building %s", what, target)
        dsdict = build()
        # Arrow's own byte count of the built tables: what save_to_disk writes (plus a few KB of json)
        needed = sum(split.data.nbytes for split in dsdict.values())
        with writing(what, root, needed, key="storage.cache_dir"), \
                atomic_folder(target) as tmp:
            dsdict.save_to_disk(str(tmp))
    return load_from_disk(str(target))


def tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> str:
    """Class, name, vocabulary size, truncation side and a hash of the full tokenizer definition."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        definition = json.dumps(sorted(tokenizer.get_vocab().items()))
    else:
        # transformers sets truncation/padding on the backend per call: state, not identity
        spec = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
        definition = json.dumps(spec, sort_keys=True)
    return content_key(
        type(tokenizer).__name__,
        tokenizer.name_or_path,
        len(tokenizer),
        tokenizer.truncation_side,
        hashlib.sha256(definition.encode()).hexdigest(),
    )

