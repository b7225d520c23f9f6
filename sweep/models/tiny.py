"""Tiny models built offline from ``model.builder`` params: a BPE tokenizer trained on a
deterministic corpus and a small RoBERTa, GPT-2 or BERT body, saved the way ``save_pretrained`` does.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaTokenizerFast,
)

from sweep.config.model_limits import position_offset
from sweep.data.synthetic import corpus_sentences
from sweep.files import atomic_folder, is_model_folder
from sweep.models.quiet import quiet_transformers
from sweep.models.tiny_recipe import ARCHS

log = logging.getLogger(__name__)


ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
GPT2_EOS = "<|endoftext|>"
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


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

# The config's own names for (hidden size, layers, heads, intermediate size, positions).
BERT_SIZE_NAMES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   "max_position_embeddings")
GPT2_SIZE_NAMES = ("n_embd", "n_layer", "n_head", "n_inner", "n_positions")


@dataclass(frozen=True)
class _Body:
    """One architecture's config and model classes, its names for the sizes, and its special ids."""

    config: type[PretrainedConfig]
    model: type[PreTrainedModel]
    size_names: tuple[str, ...]
    special_ids: Callable[[PreTrainedTokenizerBase], dict[str, Any]]

    def build(self, tok: PreTrainedTokenizerBase, h: int, layers: int, heads: int, pos: int) -> PreTrainedModel:
        sizes = dict(zip(self.size_names, (h, layers, heads, 4 * h, pos), strict=True))
        return self.model(self.config(vocab_size=len(tok), **sizes, **self.special_ids(tok)))


_ROBERTA = _Body(RobertaConfig, RobertaForMaskedLM, BERT_SIZE_NAMES, lambda tok: {
    "type_vocab_size": 1, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id,
    "eos_token_id": tok.eos_token_id})
# GPT-2 has no pad token: eos stands for all three
_GPT2 = _Body(GPT2Config, GPT2LMHeadModel, GPT2_SIZE_NAMES, lambda tok: dict.fromkeys(
    ("bos_token_id", "eos_token_id", "pad_token_id"), tok.eos_token_id))
_BERT = _Body(BertConfig, BertForMaskedLM, BERT_SIZE_NAMES, lambda tok: {"pad_token_id": tok.pad_token_id})


TokenizerBuilder = Callable[[Iterable[str], int, int], PreTrainedTokenizerBase]
ModelBuilder = Callable[[PreTrainedTokenizerBase, int, int, int, int], PreTrainedModel]
# arch -> (tokenizer builder, model builder, positions the tokenizer may use)
_BUILDERS: dict[str, tuple[TokenizerBuilder, ModelBuilder, Callable[[int], int]]] = {
    "roberta": (_roberta_tokenizer, _ROBERTA.build,
                lambda pos: pos - position_offset("roberta", ROBERTA_SPECIALS.index("<pad>"))),
    "gpt2": (_gpt2_tokenizer, _GPT2.build, lambda pos: pos),
    "bert": (_bert_tokenizer, _BERT.build, lambda pos: pos),
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




