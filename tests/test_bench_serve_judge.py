"""``bench_serve_vs_transformers.py --judge``: issue [22]'s goals over the repeats of several runs, compared
repeat by repeat (runs on machines of other speeds pool their ratios, not their tokens/s)."""

from __future__ import annotations

import gc
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_serve_vs_transformers.py"


def bench_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_serve_vs_transformers", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    gc.callbacks.remove(module.COLLECTOR._observe)  # the clients' collector timing: not this process's
    return module


def run_json(path: Path, repeats: dict[str, list[tuple[float, float]]]) -> Path:
    """A run of one cell (tiny, busy, 16 streamed clients): per server its repeats' (tokens/s, TTFT p99 ms)."""
    runs = {kind: [{"tokens_per_s": tok, "ttft_p99_ms": p99, "errors": 0, "tokens_from": {"usage": 1}}
                   for tok, p99 in values] for kind, values in repeats.items()}
    cell = {"model": "tiny", "load": "busy", "clients": 16, "streamed": True, "runs": runs}
    path.write_text(json.dumps({"models": [{"model": "tiny", "cells": [cell]}]}))
    return path


def test_runs_of_other_speeds_are_compared_repeat_by_repeat(tmp_path: Path) -> None:
    # a fast machine where sweep is 10% ahead, a slow one where it is 2% behind, 3 repeats each: the median
    # of the six repeats' ratios is between (1.04); medians of the pooled tokens/s would mix the machines
    fast = run_json(tmp_path / "fast.json", {
        "sweep": [(1100, 50), (1111, 50), (1089, 50)],
        "sweep-threads=2": [(800, 100), (800, 100), (800, 100)],
        "transformers": [(1000, 100), (1010, 100), (990, 100)],
    })
    slow = run_json(tmp_path / "slow.json", {
        "sweep": [(294, 200), (98, 200), (294, 200)],
        "sweep-threads=2": [(300, 100), (100, 100), (300, 100)],
        "transformers": [(300, 100), (100, 100), (300, 100)],
    })
    bench = bench_module()
    (model,) = bench.pooled_models([fast, slow])
    (cell,) = model["cells"]
    assert cell["ratios"]["sweep/transformers"] == {"tokens_per_s": 1.04, "ttft_p99_ms": 1.25}
    assert cell["ratios"]["sweep-threads=2/transformers"]["tokens_per_s"] == 0.9
    assert sorted(bench.paired_ratios(cell)) == [0.98, 0.98, 0.98, 1.1, 1.1, 1.1]

    judged = bench.goals([model])
    assert judged["met"]["tokens_per_s"] and not judged["missed"]["tokens_per_s"]
    assert judged["missed"]["p99"] == ["tiny busy C=16 streamed (1.25x)"]  # sweep's p99 twice the slow run's
    assert judged["met"]["default_vs_best_threads"]  # 1.04 against threads=2's 0.9


def test_judge_prints_the_goals_and_refuses_a_file_that_is_no_result(tmp_path: Path) -> None:
    one = run_json(tmp_path / "one.json", {"sweep": [(90, 100)], "transformers": [(100, 100)]})
    judged = subprocess.run([sys.executable, str(BENCH), "--judge", str(one)], capture_output=True, text=True,
                            timeout=120)
    assert judged.returncode == 0, judged.stderr
    assert "tokens/s >= 1.0x transformers serve: 0/1 cells; missed: tiny busy C=16 streamed (0.9x)" in judged.stdout

    log = tmp_path / "bench.log"
    log.write_text("tiny busy C=16 streamed sweep repeat 0: 90 tok/s\n")
    refused = subprocess.run([sys.executable, str(BENCH), "--judge", str(one), str(log)], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1
    assert f"--judge: {log} is not a result of this script" in refused.stderr
    assert "Traceback" not in refused.stderr
