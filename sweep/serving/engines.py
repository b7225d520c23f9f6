"""A fine-tuned model loaded for serving, and one batched forward pass of it.

What the folder holds is model_kind.py's answer. The methods here run on the batcher's single worker
thread; only ``count_tokens`` and ``render_chat`` run on the event loop, with their own tokenizer (a
fast tokenizer is not safe to share across threads). A streamed ``generate`` hands each row's text to
a callback after every decoding step, and stops at once when its ``cancelled`` event is set (the
client went away).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from sweep.config.model_limits import usable_positions
from sweep.models.quiet import quiet_transformers
from sweep.serving.generation import finish_completion, streamable_text
from sweep.serving.model_kind import CAUSAL_LM, CLASSIFIER, ModelKindError
from sweep.serving.model_location import task_inputs
from sweep.serving.protocol import Classification, Completion, GenerationParams
from sweep.train.loading import load_tokenizer, pick_device

# A tokenizer without a real limit reports a huge sentinel as model_max_length.
_NO_LIMIT = 1_000_000


def context_length(config: PretrainedConfig, tokenizer_limit: int) -> int:
    """Tokens the model can attend to: the position table, less RoBERTa's padding offset."""
    positions = usable_positions(config)
    if positions is None:
        raise ModelKindError(f"{config.model_type}: config has no max_position_embeddings")
    return min(positions, tokenizer_limit) if tokenizer_limit < _NO_LIMIT else positions


class Classifier:
    kind = CLASSIFIER

    def __init__(self, model_dir: Path, device: str = "auto") -> None:
        self.device = pick_device(device)
        self.tokenizer = load_tokenizer(model_dir)
        with quiet_transformers():
            self.model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True)
        self.model.to(self.device).eval()
        self.max_length = context_length(self.model.config, self.tokenizer.model_max_length)
        self.regression = self.model.config.num_labels == 1
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        self.inputs = task_inputs(model_dir)  # what its task takes: text, or text and text_pair

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "labels": None if self.regression else self.labels, "max_length": self.max_length}

    def classify(self, _key: Hashable | None, items: Sequence[tuple[str, str | None]]) -> list[Classification]:
        """One forward pass; inputs longer than the context are truncated, as in fine-tuning."""
        texts = [text for text, _ in items]
        pairs = [pair for _, pair in items]
        encoded = self.tokenizer(
            texts, pairs if pairs[0] is not None else None,
            padding=True, truncation=True, max_length=self.max_length, return_tensors="pt",
        ).to(self.device)
        with torch.inference_mode():
            logits = self.model(**encoded).logits.float()
        if self.regression:
            return [Classification(None, float(v)) for v in logits[:, 0].tolist()]
        probs = torch.softmax(logits, dim=-1)
        scores, indices = probs.max(dim=-1)
        return [Classification(self.labels[i], float(s)) for i, s in zip(indices.tolist(), scores.tolist())]


class StopOnText(StoppingCriteria):
    """Ends a row once its generated text holds a stop sequence.

    Not ``generate(stop_strings=...)``: that matches the end of prompt + completion, so a stop
    sequence straddling the prompt's end would stop a row whose completion does not contain it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        generated = self.tokenizer.batch_decode(input_ids[:, self.prompt_width:], skip_special_tokens=True)
        hits = [any(stop in text for stop in self.stops) for text in generated]
        return torch.tensor(hits, dtype=torch.bool, device=input_ids.device)


class StopWhenCancelled(StoppingCriteria):
    """Ends every row once ``cancelled`` is set: a streamed request whose client disconnected."""

    def __init__(self, cancelled: threading.Event) -> None:
        self.cancelled = cancelled

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.cancelled.is_set(), dtype=torch.bool, device=input_ids.device)


class RowTextStreamer(BaseStreamer):
    """Hands ``on_texts`` every row's streamable text after each decoding step that changed one.

    ``generate`` first puts the prompts, then each step's new token of every row; the texts are read
    with ``streamable_text``, the same reading ``finish_completion`` makes of the finished rows.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], eos_token_id: int | None, stops: Sequence[str],
                 on_texts: Callable[[list[str]], None]) -> None:
        self.decode, self.eos_token_id, self.stops, self.on_texts = decode, eos_token_id, tuple(stops), on_texts
        self.rows: list[list[int]] | None = None
        self.texts: list[str] = []

    def put(self, value: torch.Tensor) -> None:
        if self.rows is None:  # the prompts
            self.rows = [[] for _ in range(value.shape[0])]
            self.texts = [""] * len(self.rows)
            return
        for row, token in zip(self.rows, value.reshape(-1).tolist()):
            row.append(token)
        texts = [streamable_text(row, self.decode, self.eos_token_id, self.stops) for row in self.rows]
        if texts != self.texts:
            self.texts = texts
            self.on_texts(texts)

    def end(self) -> None:
        pass


class Generator:
    kind = CAUSAL_LM

    def __init__(self, model_dir: Path, device: str = "auto", weights: bool = True) -> None:
        """``weights=False``: tokenizers and config only (continuous batching decodes in its own process);
        ``load_weights()`` loads the model when this process generates after all."""
        self.model_dir = Path(model_dir)
        self.device = pick_device(device)
        self.tokenizer = load_tokenizer(model_dir)
        self.tokenizer.padding_side = "left"  # new tokens follow every prompt directly
        self._counting_tokenizer = load_tokenizer(model_dir)
        backend = getattr(self._counting_tokenizer, "backend_tokenizer", None)
        plain = backend is not None and not getattr(self._counting_tokenizer, "clean_up_tokenization_spaces", True)
        self._rust_decode = backend.decode if plain else None
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        self.architecture = (config.architectures or [config.model_type])[0]
        self.context_length = context_length(config, self.tokenizer.model_max_length)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.model: PreTrainedModel | None = None
        if weights:
            self.load_weights()

    def load_weights(self) -> None:
        if self.model is None:
            with quiet_transformers():
                self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, local_files_only=True)
            self.model.to(self.device).eval()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "context_length": self.context_length}

    def count_tokens(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.token_ids(prompts)]

    def token_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        """The prompts' token ids, on the event loop (continuous batching tokenizes there)."""
        return self._counting_tokenizer(list(prompts))["input_ids"]

    def decode_on_loop(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (every streamed sequence's, after every step): the Rust tokenizer's own decode,
        which is what ``tokenizer.decode`` returns when it cleans up no spaces, without its Python-side
        conversions (most of a short decode's time (docs/benchmarks.md: Behind the code's choices))."""
        if self._rust_decode is not None:
            return self._rust_decode(list(ids), skip_special_tokens=True)
        return self._counting_tokenizer.decode(list(ids), skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self._counting_tokenizer.chat_template is not None

    def render_chat(self, messages: Sequence[Mapping[str, str]], chat_template: str | None = None) -> str:
        """A chat as the prompt text its template makes, ending where the assistant's answer begins."""
        return self._counting_tokenizer.apply_chat_template(
            list(messages), chat_template=chat_template, tokenize=False, add_generation_prompt=True
        )

    def generate(
        self,
        params: GenerationParams,
        prompts: Sequence[str],
        on_texts: Callable[[list[str]], None] | None = None,
        cancelled: threading.Event | None = None,
    ) -> list[Completion]:
        """One ``generate`` call for prompts that share ``params`` (the batch key carries them).

        Streamed: ``on_texts`` gets every row's text so far after each step; ``cancelled`` stops it.
        """
        encoded = self.tokenizer(list(prompts), padding=True, return_tensors="pt").to(self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.eos_token_id,
            "do_sample": params.sampling,
        }
        if params.sampling:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        prompt_width = encoded["input_ids"].shape[1]
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        criteria: list[StoppingCriteria] = []
        if params.stop:  # stop a row early; its text is cut at the stop sequence below
            criteria.append(StopOnText(self.tokenizer, params.stop, prompt_width))
        if cancelled is not None:
            criteria.append(StopWhenCancelled(cancelled))
        if criteria:
            kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
        if on_texts is not None:
            kwargs["streamer"] = RowTextStreamer(decode, self.eos_token_id, params.stop, on_texts)
        if params.seed is not None:
            torch.manual_seed(params.seed)  # safe: forward passes run one at a time
        with torch.inference_mode(), quiet_transformers():
            output = self.model.generate(**encoded, **kwargs)
        prompt_tokens = encoded["attention_mask"].sum(dim=1).tolist()
        return [
            finish_completion(row[prompt_width:].tolist(), n, decode, self.eos_token_id, params.stop,
                              params.max_new_tokens)
            for row, n in zip(output, prompt_tokens)
        ]
