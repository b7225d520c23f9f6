"""Perplexity on the WikiText-2 test split before fine-tuning and after N epochs on the valid split.

The shared copy of WikiText-2 has no train file, so the model trains on ``wiki.valid.tokens`` and
is scored on ``wiki.test.tokens`` (every token of it, blocks of ``--block-size``), as the sweep does with
``task=wikitext-2 task.wikitext-2.train_split=valid task.wikitext-2.eval_splits=[test]``. Before and
after go through the same evaluation code (``sweep.train.evaluate.evaluate``), in the same run.

Token perplexity depends on the tokenizer (tiny-gpt2 has a 2,000-token BPE trained on synthetic
text), so a word-level perplexity is printed too: the same total loss over the test split's words
(whitespace-separated, plus one end-of-line per line, as WikiText's word-level models count them).

    python scripts/bench_perplexity.py                               # tiny-gpt2, 3 epochs, ../shared/data
    python scripts/bench_perplexity.py --model gpt2 --model-path DIR --epochs 1 --block-size 512
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from sweep.config.settings import TrainConfig
from sweep.config.tasks import TaskSpec, task_from_config
from sweep.config.validate import compose, compose_settings
from sweep.data.collate import make_lm_collator
from sweep.data.lm import lm_blocks
from sweep.models.local_folder import resolve_model_dir
from sweep.train.evaluate import evaluate
from sweep.train.loading import load_for_task, pick_device
from sweep.train.loop import finetune, quiet_progress_bars

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SPLIT, TEST_SPLIT = "valid", "test"


def model_dir(name: str, path: Path | None, cache: Path) -> Path:
    cfg = compose(f"model={name}")
    if path is not None:
        cfg.model.path = str(path)
    return resolve_model_dir(cfg.model, cache)


def wikitext_valid_to_test() -> TaskSpec:
    cfg = compose("task=wikitext-2", f"task.wikitext-2.train_split={TRAIN_SPLIT}",
                  f"task.wikitext-2.eval_splits=[{TEST_SPLIT}]")
    return task_from_config(cfg.task["wikitext-2"])


def words_in(path: Path) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(len(line.split()) for line in lines) + len(lines)


def perplexity_on_test(spec: TaskSpec, model_path: Path, data_dir: Path, train: TrainConfig, cache: Path) -> dict:
    """Perplexity of a saved model over the whole test split, and the numbers behind it."""
    tokenizer, model = load_for_task(model_path, spec)
    device = pick_device()
    model.to(device)
    blocks = lm_blocks(spec, tokenizer, data_dir, train.block_size, cache)[TEST_SPLIT]
    loader = DataLoader(blocks, batch_size=train.eval_batch_size, collate_fn=make_lm_collator(tokenizer))
    t0 = time.perf_counter()
    metrics = evaluate(model, loader, spec, device, None)
    predicted = sum(len(ids) - 1 for ids in blocks["input_ids"])
    return {"eval_loss": metrics["eval_loss"], "perplexity": metrics["perplexity"], "blocks": len(blocks),
            "predicted_tokens": predicted, "seconds": round(time.perf_counter() - t0, 2)}


def word_perplexity(result: dict, words: int) -> float:
    return math.exp(min(result["eval_loss"] * result["predicted_tokens"] / words, 50.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--model", default="tiny-gpt2", help="a model config name (sweep/conf/model)")
    p.add_argument("--model-path", type=Path, default=None, help="its save_pretrained folder (model.path)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--train-blocks", type=int, default=None, help="cap the training blocks (default: all)")
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "sweep")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "perplexity.json")
    args = p.parse_args()
    quiet_progress_bars()

    spec = wikitext_valid_to_test()
    base = model_dir(args.model, args.model_path, args.cache_dir)
    train = replace(compose_settings().train, lr=args.lr, batch_size=args.batch_size, epochs=args.epochs,
                    block_size=args.block_size, eval_batch_size=32, max_train_samples=args.train_blocks)
    words = words_in(args.data_dir / spec.folder / spec.eval_files[TEST_SPLIT])

    before = perplexity_on_test(spec, base, args.data_dir, train, args.cache_dir)
    print(f"before: test perplexity {before['perplexity']:.2f} ({before['blocks']} blocks, {before['seconds']} s)")
    with tempfile.TemporaryDirectory(prefix="bench-ppl-") as tmp:
        t0 = time.perf_counter()
        result = finetune(spec, base, args.data_dir, train, args.seed, out_dir=Path(tmp), cache_dir=args.cache_dir)
        train_seconds = time.perf_counter() - t0
        after = perplexity_on_test(spec, result.checkpoint_dir, args.data_dir, train, args.cache_dir)
    per_epoch = [round(e.metrics["perplexity"], 3) for e in result.epochs]

    rows = [("before fine-tuning", before),
            (f"after {args.epochs} epoch(s) on valid (best: {result.best_epoch})", after)]
    print()
    print(f"WikiText-2 test split, {args.model}, blocks of {args.block_size} tokens")
    print(f"{'':40} {'token ppl':>12} {'word ppl':>12} {'mean loss':>10}")
    for label, r in rows:
        print(f"{label:40} {r['perplexity']:>12.2f} {word_perplexity(r, words):>12.2f} {r['eval_loss']:>10.4f}")
    print(f"test perplexity after each epoch: {per_epoch}; fine-tuning took {train_seconds:.1f} s")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model": args.model, "task": "wikitext-2", "train_split": TRAIN_SPLIT, "eval_split": TEST_SPLIT,
        "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "block_size": args.block_size,
        "train_blocks": args.train_blocks, "seed": args.seed, "test_words": words,
        "before": {**before, "word_perplexity": word_perplexity(before, words)},
        "after": {**after, "word_perplexity": word_perplexity(after, words), "best_epoch": result.best_epoch},
        "test_perplexity_per_epoch": per_epoch, "train_seconds": round(train_seconds, 1),
        "device": str(pick_device()), "host": platform.node(), "torch_threads": torch.get_num_threads(),
    }, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
