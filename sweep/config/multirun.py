"""Hydra multirun (``python -m sweep -m model=a,b task=RTE``): one sweep per combination, each in
its own folder, then one table that compares them.

Hydra's basic launcher runs the jobs one after another in this process; each job is a whole
sweep (its tasks and seeds in one Tune run), and this callback reads what each one wrote.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per (job, task) from each job's summary.csv, with the job's overrides."""
    rows = []
    for summary in sorted(Path(sweep_dir).glob("*/summary.csv"), key=lambda p: p.parent.name):
        overrides_file = summary.parent / ".hydra" / "overrides.yaml"
        overrides = OmegaConf.load(overrides_file) if overrides_file.exists() else []
        for row in csv.DictReader(summary.open()):
            rows.append({"job": summary.parent.name, "overrides": " ".join(overrides), **row})
    return rows


def varying(rows: list[dict[str, Any]]) -> dict[str, str]:
    """job -> only the overrides that differ between jobs (model=gpt2), the shared ones dropped."""
    per_job = {r["job"]: r["overrides"].split() for r in rows}
    shared = set.intersection(*(set(o) for o in per_job.values())) if per_job else set()
    return {job: " ".join(o for o in overrides if o not in shared) for job, overrides in per_job.items()}


def format_comparison(rows: list[dict[str, Any]]) -> str:
    differs = varying(rows)
    head = (f"{'job':<4} {'overrides':<40} {'task':<8} {'metric':<11} {'n':>3} {'mean ± std':>17} "
            f"{'best seed':>9} {'best':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        best = f"{float(r['best_score']):8.4f}" if r.get("best_score") else f"{'-':>8}"
        lines.append(
            f"{r['job']:<4} {differs[r['job']][:40]:<40} {r['task']:<8} {r['metric']:<11} {r['n']:>3} "
            f"{float(r['mean']):8.4f} ± {float(r['std']):6.4f} {r['best_seed'] or '-':>9} {best}"
        )
    return "\n".join(lines)


class CompareSweeps(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect(sweep_dir)
        if not rows:
            print(f"multirun: no sweep in {sweep_dir} finished; nothing to compare")
            return
        print(format_comparison(rows))
        with (sweep_dir / "comparison.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"comparison: {sweep_dir / 'comparison.csv'}")
