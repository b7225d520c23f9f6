"""The winner's curse, measured on a finished sweep: per task, the best seed's dev score when the seed is picked on
dev against when it is picked on the selection split, the dev scores' mean and 95% interval over the seeds, and
the soup (sweep.soup=true) against the best seed. A Markdown table for docs/results.md.

    python scripts/selection_table.py OUT_DIR

OUT_DIR: a sweep's out_dir run with a selection split (the default sweep.selection=train). Every trial's
``report_score`` is its dev score at the checkpoint the selection split chose, so "picked on dev" here is the
best of those: a sweep deciding everything on dev (sweep.selection=none) would also pick each seed's
checkpoint on dev, and quote a number at least this high.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from sweep.results.intervals import mean_interval


def rows(out_dir: Path) -> list[dict]:
    results = json.loads((out_dir / "results.json").read_text())
    summaries = {s["task"]: s for s in results["summary"]}
    table = []
    for task, summary in summaries.items():
        done = [t for t in results["trials"] if t["task"] == task and t["score"] is not None
                and t["report_score"] is not None]
        if not done:
            continue
        sign = 1 if summary["mode"] == "max" else -1
        on_dev = max(done, key=lambda t: (sign * t["report_score"], -t["seed"]))
        on_selection = max(done, key=lambda t: (sign * t["score"], -t["seed"]))
        dev = [t["report_score"] for t in done]
        interval = mean_interval(dev)
        table.append({
            "task": task, "metric": summary["metric"], "seeds": len(done), "trivial": summary["trivial_score"],
            "picked_on_dev": on_dev["report_score"], "dev_pick_seed": on_dev["seed"],
            "picked_on_selection": on_selection["report_score"], "selection_pick_seed": on_selection["seed"],
            "best_selection": on_selection["score"], "mean": statistics.fmean(dev),
            "ci": interval, "soup_selection": summary.get("soup_score"), "soup_dev": summary.get("soup_report_score"),
            "soup_wins": summary.get("soup_wins"),
        })
    return table


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def markdown(table: list[dict]) -> str:
    lines = ["| task (metric) | seeds | trivial (dev) | best picked on dev | best picked on selection, on dev | "
             "dev mean [95% CI] | soup: selection / dev | best seed: selection / dev |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        ci = f"[{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]" if r["ci"] else "–"
        soup = f"{_f(r['soup_selection'])} / {_f(r['soup_dev'])}" + (" (wins)" if r["soup_wins"] else "")
        lines.append(
            f"| {r['task']} ({r['metric']}) | {r['seeds']} | {_f(r['trivial'])} | {_f(r['picked_on_dev'])} "
            f"(seed {r['dev_pick_seed']}) | {_f(r['picked_on_selection'])} (seed {r['selection_pick_seed']}) | "
            f"{r['mean']:.4f} {ci} | {soup} | {_f(r['best_selection'])} / {_f(r['picked_on_selection'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    print(markdown(rows(parser.parse_args().out_dir)))


if __name__ == "__main__":
    main()
