"""Tokens/s of the fine-tuning loop with dynamic padding (optionally with
length-grouped batches) vs padding every batch to 128.

The original workflow padded every batch to max_seq_length; we pad each batch to its longest
row. Same model, same data, same run: the ratio is what counts, not the absolute numbers.

    python scripts/bench_padding.py                       # real RTE + SST-2 from ../shared/data, MiniLM
    python scripts/bench_padding.py --samples 256 --model tiny-roberta --data-dir DIR
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from sweep.config.tasks import load_task
from sweep.config.validate import compose, compose_settings
from sweep.models.local_folder import resolve_model_dir
from sweep.train.loop import finetune

ROOT = Path(__file__).resolve().parents[1]
MODES = (("max_length", False), ("dynamic", False), ("dynamic", True))  # the original's first: the baseline


def model_dir(name: str, cache: Path) -> Path:
    cfg = compose(f"model={name}")
    return resolve_model_dir(cfg.model, cache)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--tasks", nargs="+", default=["RTE", "SST-2"])
    p.add_argument("--model", default="minilm")
    p.add_argument("--samples", type=int, default=512, help="training rows per task and mode")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "sweep")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "padding.json")
    args = p.parse_args()

    mdir = model_dir(args.model, args.cache_dir)
    base = replace(compose_settings().train, lr=2e-5, batch_size=args.batch_size, epochs=1,
                   max_seq_length=args.max_seq_length, max_train_samples=args.samples, max_eval_samples=32)
    rows = []
    for task in args.tasks:
        spec = load_task(task)
        # warm-up (tokenization cache, allocator, kernels) so neither mode pays it
        finetune(spec, mdir, args.data_dir, replace(base, max_train_samples=64), seed=0, cache_dir=args.cache_dir)
        for padding, grouped in MODES:
            t0 = time.perf_counter()
            cfg = replace(base, padding=padding, group_by_length=grouped)
            epoch = finetune(spec, mdir, args.data_dir, cfg, seed=38, cache_dir=args.cache_dir).epochs[0]
            padding = padding + ("+grouped" if grouped else "")
            rows.append({
                "task": task, "padding": padding, "samples": args.samples,
                "train_seconds": round(epoch.train_seconds, 3),
                "real_tokens": epoch.train_tokens, "padded_tokens": epoch.padded_tokens,
                "real_tokens_per_s": round(epoch.train_tokens / epoch.train_seconds, 1),
                "samples_per_s": round(args.samples / epoch.train_seconds, 2),
                "wall_seconds": round(time.perf_counter() - t0, 2),
            })
            print(f"{task:6} {padding:10} {rows[-1]['real_tokens_per_s']:>10.1f} real tok/s  "
                  f"{epoch.padded_tokens / epoch.train_tokens:5.2f}x padding  {epoch.train_seconds:7.2f} s")
    print()
    print(f"{'task':6} {'dynamic / max_length':>22} {'dynamic+grouped / max_length':>30}  (real tokens/s)")
    ratios = {}
    for task in args.tasks:
        by = {r["padding"]: r["real_tokens_per_s"] for r in rows if r["task"] == task}
        ratios[task] = {m: round(by[m] / by["max_length"], 3) for m in ("dynamic", "dynamic+grouped")}
        print(f"{task:6} {ratios[task]['dynamic']:>21.2f}x {ratios[task]['dynamic+grouped']:>29.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model": args.model, "device": str(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "host": platform.node(), "torch_threads": torch.get_num_threads(), "rows": rows, "speedup": ratios,
    }, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
