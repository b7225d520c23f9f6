"""Full fine-tuning vs LoRA (train.method=lora), the same run: same model, data, seeds and recipe
but for each method's own learning rate (full 2e-5, LoRA 5e-4: conf/train/default.yaml's lr=null).

Per task and method, over seeds 42..42+N-1 (the method that goes first alternates per seed):
dev score (mean ± std), trainable parameters (PEFT's count), checkpoint bytes (the folder a trial
saves: model or adapter + head, tokenizer, optimizer state), seconds per training step (the
evaluations' train_seconds over the steps), and the training process's peak resident memory
(each run in its own process, ru_maxrss of that child). Also the step-time ratio LoRA / full that
sweep.plan.costs.METHOD_STEP_RATIO uses for the plan and the ETA.

    HF_HUB_OFFLINE=1 python scripts/bench_peft.py --data-dir ../shared/data --task SST-2 --rows 4000 --epochs 2
    HF_HUB_OFFLINE=1 python scripts/bench_peft.py --data-dir ../shared/data --task RTE --rows 1000 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FIRST_SEED = 42
METHODS = ("full", "lora")


def _one_run(args: dict, queue) -> None:
    """One fine-tune in this (child) process; puts its figures on ``queue``."""
    from sweep.config.tasks import load_task
    from sweep.config.validate import compose_settings
    from sweep.disk import folder_size
    from sweep.models.local_folder import resolve_model_dir
    from sweep.train.loop import finetune, setup
    from sweep.train.lora import trainable_parameters

    settings = compose_settings(f"model={args['model']}", f"train.method={args['method']}",
                                f"train.epochs={args['epochs']}", f"train.max_train_samples={args['rows']}",
                                f"train.batch_size={args['batch_size']}", f"train.max_seq_length={args['max_length']}")
    spec = load_task(args["task"])
    model_dir = resolve_model_dir(args["model_spec"], Path(args["cache"]))
    with tempfile.TemporaryDirectory() as tmp:
        result = finetune(spec, model_dir, Path(args["data_dir"]), settings.train, seed=args["seed"],
                          out_dir=Path(tmp) / "ckpt", cache_dir=Path(args["cache"]))
        checkpoint_bytes = folder_size(Path(tmp) / "ckpt")
    run = setup(spec, model_dir, Path(args["data_dir"]), settings.train, args["seed"], Path(args["cache"]))
    trainable, total = trainable_parameters(run.model)
    steps = result.epochs[-1].step
    queue.put({
        "task": args["task"], "method": args["method"], "seed": args["seed"], "lr": settings.train.lr,
        "score": result.best.score, "trainable": trainable, "params": total, "checkpoint_bytes": checkpoint_bytes,
        "seconds_per_step": sum(e.train_seconds for e in result.epochs) / steps, "steps": steps,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    })


def run_in_child(args: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_one_run, args=(args, queue))
    proc.start()
    row = queue.get()
    proc.join()
    return row


def summarize(rows: list[dict]) -> dict:
    out = {}
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        scores = [r["score"] for r in mine]
        out[method] = {
            "lr": mine[0]["lr"], "n": len(mine), "score_mean": statistics.fmean(scores),
            "score_std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
            "trainable": mine[0]["trainable"], "params": mine[0]["params"],
            "checkpoint_bytes": statistics.median(r["checkpoint_bytes"] for r in mine),
            "seconds_per_step": statistics.median(r["seconds_per_step"] for r in mine),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
        }
    full, lora = out["full"], out["lora"]
    standard_error = full["score_std"] / max(1, full["n"]) ** 0.5
    out["ratios"] = {
        "score_diff": lora["score_mean"] - full["score_mean"], "full_standard_error": standard_error,
        "trainable_share": lora["trainable"] / full["trainable"],
        "checkpoint_smaller_x": full["checkpoint_bytes"] / lora["checkpoint_bytes"],
        "step_speedup_x": full["seconds_per_step"] / lora["seconds_per_step"],
        "step_time_ratio_lora_over_full": lora["seconds_per_step"] / full["seconds_per_step"],
        "peak_rss_ratio": lora["peak_rss_mib"] / full["peak_rss_mib"],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="a folder holding glue_data/<TASK>/ (../shared/data)")
    parser.add_argument("--task", default="SST-2")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cache", default=os.environ.get("SWEEP_CACHE_DIR", str(Path.home() / ".cache" / "sweep")))
    parser.add_argument("--out", default="bench_results/peft.json")
    a = parser.parse_args()

    from dataclasses import asdict

    from sweep.config.validate import compose_settings

    model_spec = asdict(compose_settings(f"model={a.model}").model)
    rows = []
    for i in range(a.seeds):
        order = METHODS if i % 2 == 0 else METHODS[::-1]  # ABBA: neither method always goes first
        for method in order:
            row = run_in_child({"task": a.task, "model": a.model, "model_spec": model_spec, "method": method,
                                "seed": FIRST_SEED + i, "epochs": a.epochs, "rows": a.rows, "batch_size": a.batch_size,
                                "max_length": a.max_length, "data_dir": a.data_dir, "cache": a.cache})
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = summarize(rows)
    for method in METHODS:
        s = summary[method]
        print(f"{a.task} {method:<4} lr {s['lr']:.0e}: {s['score_mean']:.4f} ± {s['score_std']:.4f} (n={s['n']}), "
              f"{s['trainable']:,} of {s['params']:,} parameters trained, "
              f"checkpoint {s['checkpoint_bytes'] / 2**20:.2f} MiB, {s['seconds_per_step'] * 1000:.0f} ms/step, "
              f"peak RSS {s['peak_rss_mib']:.0f} MiB")
    print(json.dumps(summary["ratios"], indent=2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"args": vars(a), "runs": rows, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
