"""Our fine-tuning loop vs a plain Hugging Face ``Trainer``: the same recipe, the same run.

Same model (MiniLM by default), same tokenized rows (our ``prepare_data``: the same seeded subset,
the same truncation to --max-length, not padded), the same dynamic padding per batch (each side's
collator pads a batch to its longest row), the same AdamW (lr, betas, eps, weight decay 0.01 on
everything but biases and LayerNorm weights), the same gradient clipping (1.0), the same schedule
(linear decay to 0 over all steps, no warm-up: our loop always decays linearly, the Trainer's
default scheduler is linear, and warm-up is 0 on both), fp32, batch size, epochs, no DataLoader
workers, no evaluation or checkpoint during training. Each side's dev score comes from the same
``sweep.train.loop.evaluate`` on the trained model.

Training samples/s = rows x epochs / seconds of the training epochs only: our Evaluation's
train_seconds; for the Trainer the time between its on_epoch_begin and on_epoch_end callbacks (its
whole ``train()`` wall time, setup included, is written too). Seeds 42..42+N-1; per seed the side
that goes first alternates (ABBA), after one untimed warm-up of both sides.

    HF_HUB_OFFLINE=1 python scripts/bench_vs_trainer.py --task SST-2 --rows 2000 --epochs 1 --seeds 3
    HF_HUB_OFFLINE=1 python scripts/bench_vs_trainer.py --task RTE --rows 1000 --epochs 1 --seeds 3
    # the loop as it was, from a saved copy of sweep/train/loop.py:
    python scripts/bench_vs_trainer.py ... --ours-module /tmp/finetune_before.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from sweep.config.tasks import load_task  # noqa: E402
from sweep.config.validate import compose, compose_settings  # noqa: E402
from sweep.models.local_folder import resolve_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIRST_SEED = 42


def load_ours(path: Path | None):
    """sweep.train.loop, or a saved copy of it (to measure the loop as it was)."""
    if path is None:
        import sweep.train.loop as mod
        return mod
    spec = importlib.util.spec_from_file_location("sweep_finetune_copy", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def recipe(args) -> object:
    return replace(
        compose_settings().train,
        lr=args.lr, batch_size=args.batch_size, eval_batch_size=64, epochs=args.epochs,
        max_seq_length=args.max_length, warmup_ratio=0.0, weight_decay=0.01, max_grad_norm=1.0,
        precision="fp32", padding="dynamic", group_by_length=False,
        max_train_samples=args.rows, max_eval_samples=args.eval_rows, num_workers=0,
    )


def run_ours(ours, spec, mdir, args, train, seed) -> dict:
    t0 = time.perf_counter()
    res = ours.finetune(spec, mdir, args.data_dir, train, seed, cache_dir=args.cache_dir, device=torch.device("cpu"))
    wall = time.perf_counter() - t0
    train_s = sum(e.train_seconds for e in res.epochs)
    last = res.epochs[-1]  # the final model, as the Trainer's (not the best epoch)
    return {
        "seed": seed, "train_seconds": train_s, "samples_per_s": args.rows * args.epochs / train_s,
        "score": last.metrics[spec.metric], "train_loss": last.train_loss, "wall_seconds": wall,
        "threads": torch.get_num_threads(),
    }


def run_trainer(ours, spec, mdir, args, train, seed) -> dict:
    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    from sweep.train.loading import load_tokenizer

    class EpochClock(TrainerCallback):
        def __init__(self):
            self.seconds, self._t = 0.0, 0.0

        def on_epoch_begin(self, *a, **k):
            self._t = time.perf_counter()

        def on_epoch_end(self, *a, **k):
            self.seconds += time.perf_counter() - self._t

    tok = load_tokenizer(mdir)
    data = ours.prepare_data(spec, tok, args.data_dir, train, args.cache_dir)  # the very rows ours trains on
    set_seed(seed)  # as ours: before the model, so the seed fixes the new head
    labels = list(spec.labels)
    model = AutoModelForSequenceClassification.from_pretrained(
        mdir, local_files_only=True, num_labels=spec.num_labels, id2label=dict(enumerate(labels)),
        label2id={x: i for i, x in enumerate(labels)}, problem_type="single_label_classification",
    )
    clock = EpochClock()
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, seed=seed, learning_rate=train.lr, per_device_train_batch_size=train.batch_size,
            num_train_epochs=train.epochs, weight_decay=train.weight_decay, max_grad_norm=train.max_grad_norm,
            lr_scheduler_type="linear", warmup_steps=0, optim=args.trainer_optim,
            use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0, eval_strategy="no",
            save_strategy="no", report_to=[], disable_tqdm=True, logging_strategy="no",
        )
        trainer = Trainer(model=model, args=targs, train_dataset=data["train"],
                          data_collator=DataCollatorWithPadding(tok, padding="longest"), callbacks=[clock])
        t0 = time.perf_counter()
        out_metrics = trainer.train()
        wall = time.perf_counter() - t0
    loader = DataLoader(data[spec.primary_eval], batch_size=train.eval_batch_size,
                        collate_fn=ours.make_collator(tok, train.padding, train.max_seq_length))
    metrics = ours.evaluate(trainer.model, loader, spec, torch.device("cpu"), None)
    return {
        "seed": seed, "train_seconds": clock.seconds, "samples_per_s": args.rows * args.epochs / clock.seconds,
        "score": metrics[spec.metric], "train_loss": out_metrics.training_loss, "train_call_seconds": wall,
        "optim": targs.optim if isinstance(targs.optim, str) else targs.optim.value, "threads": torch.get_num_threads(),
    }


def summary(runs: list[dict]) -> dict:
    def ms(key):
        xs = [r[key] for r in runs]
        return {"per_seed": xs, "mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}

    return {"samples_per_s": ms("samples_per_s"), "scores": ms("score"), "train_seconds": ms("train_seconds"),
            "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="SST-2", choices=["SST-2", "RTE"])
    p.add_argument("--rows", type=int, default=2000, help="training rows (a fixed seeded subset, the same for both)")
    p.add_argument("--eval-rows", type=int, default=None, help="dev rows (default: the whole dev set)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seeds", type=int, default=3, help="seeds 42..42+N-1")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--max-length", type=int, default=128, help="truncation (our TrainConfig default: 128)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--model", default="minilm")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--cache-dir", type=Path, default=Path(compose_settings().storage.cache_dir))
    p.add_argument("--warmup-rows", type=int, default=64, help="untimed warm-up of both sides first (0: none)")
    p.add_argument("--trainer-optim", default="adamw_torch_fused", choices=["adamw_torch_fused", "adamw_torch"],
                   help="the Trainer's optim (its default with torch >= 2.8 is adamw_torch_fused)")
    p.add_argument("--ours-module", type=Path, default=None, help="a saved copy of sweep/train/loop.py to run as ours")
    p.add_argument("--only", choices=["ours", "trainer"], default=None, help="run one side (profiling)")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "vs_trainer.json")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    ours = load_ours(args.ours_module)
    ours.quiet_progress_bars()
    import transformers
    transformers.utils.logging.set_verbosity_error()
    spec = load_task(args.task)
    mdir = resolve_model_dir(compose(f"model={args.model}").model, args.cache_dir)
    train = recipe(args)
    sides = {"trainer": run_trainer, "ours": run_ours}
    if args.only:
        sides = {args.only: sides[args.only]}

    if args.warmup_rows:
        for fn in sides.values():
            fn(ours, spec, mdir, argparse.Namespace(**{**vars(args), "rows": args.warmup_rows}),
               replace(train, max_train_samples=args.warmup_rows, epochs=1, max_eval_samples=64), seed=0)

    results: dict[str, list[dict]] = {k: [] for k in sides}
    for i in range(args.seeds):
        seed = FIRST_SEED + i
        order = list(sides) if i % 2 == 0 else list(reversed(sides))  # ABBA
        for name in order:
            r = sides[name](ours, spec, mdir, args, train, seed)
            results[name].append(r)
            print(f"seed {seed} {name:8} {r['samples_per_s']:8.2f} samples/s  {r['train_seconds']:8.2f} s  "
                  f"{spec.metric} {r['score']:.4f}  loss {r['train_loss']:.4f}", flush=True)

    summ = {k: summary(v) for k, v in results.items()}
    out = {
        "task": args.task, "model": args.model, "model_dir": str(mdir),
        "recipe": {**{k: v for k, v in asdict(train).items()}, "rows": args.rows, "eval_rows": args.eval_rows,
                   "seeds": [FIRST_SEED + i for i in range(args.seeds)], "schedule": "linear decay, no warm-up",
                   "trainer_optim": args.trainer_optim},
        "ours_module": str(args.ours_module or "sweep.train.loop"),
        "threads": args.threads, "torch": torch.__version__, "transformers": transformers.__version__,
        "host": platform.node(), "metric": spec.metric, **summ,
    }
    if len(summ) == 2:
        out["samples_per_s_ratio"] = summ["ours"]["samples_per_s"]["mean"] / summ["trainer"]["samples_per_s"]["mean"]

    print()
    print(f"{args.task}, {args.rows} rows x {args.epochs} epoch(s), {args.seeds} seed(s), {args.threads} threads, "
          f"ours = {out['ours_module']}")
    print(f"{'side':8} {'samples/s (mean ± std)':>24} {spec.metric + ' (mean ± std)':>22}")
    for name, s in summ.items():
        sp, sc = s["samples_per_s"], s["scores"]
        print(f"{name:8} {sp['mean']:13.2f} ± {sp['std']:6.2f}   {sc['mean']:12.4f} ± {sc['std']:.4f}")
    if "samples_per_s_ratio" in out:
        print(f"samples_per_s_ratio (ours / Trainer): {out['samples_per_s_ratio']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
