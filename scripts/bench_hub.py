"""The Hub as a source: from the command to the first trial, and the bytes fetched, with a cold and a warm
Hugging Face cache; against what run_glue.py does to get the same model and rows (``from_pretrained`` and
``load_dataset("nyu-mll/glue", "rte")`` in a fresh process), in the same run.

A stand-in Hub on localhost (sweep/testing/stand_in_hub.py) holds a roberta-base-shaped repo (``--size full``: a
randomly initialised model of roberta-base's shape, 125M parameters, ~499 MB of safetensors; ``tiny``: the tiny
RoBERTa) beside the formats a sweep must not fetch, and nyu-mll/glue's RTE (``../shared/data``, else synthetic).
The sweep is ``sweep task=RTE model=roberta-base train=quick 'sweep.seeds=[1,2]'``, stopped once a trial runs.

    python scripts/bench_hub.py [--size full|tiny] [--out bench_hub.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMAND = ["task=RTE", "model=roberta-base", "train=quick", "sweep.seeds=[1,2]"]
RUN_GLUE = ("import time; t = time.monotonic()\n"
            "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
            "from datasets import load_dataset\n"
            "AutoTokenizer.from_pretrained('roberta-base')\n"
            "AutoModelForSequenceClassification.from_pretrained('roberta-base', num_labels=2)\n"
            "load_dataset('nyu-mll/glue', 'rte')\n")


def model_folder(size: str, work: Path) -> Path:
    """A save_pretrained folder of roberta-base's shape (random weights) or the tiny RoBERTa, with a tokenizer."""
    from sweep.models.local_folder import resolve_model_dir
    from sweep.train.tiny_exports import TINY_ROBERTA

    tiny = resolve_model_dir(TINY_ROBERTA, work / "sweep-cache-build")
    if size == "tiny":
        return tiny
    import shutil

    from transformers import RobertaConfig, RobertaForMaskedLM

    folder = work / "roberta-base-shaped"
    RobertaForMaskedLM(RobertaConfig()).save_pretrained(folder)  # roberta-base's config: 768 x 12, 50,265 tokens
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, folder / name)
    return folder


def data_folder(work: Path) -> Path:
    shared = ROOT.parent / "shared" / "data"
    if (shared / "glue_data" / "RTE").is_dir():
        return shared
    from sweep.data.synthetic import write_synthetic_glue

    return write_synthetic_glue(work / "glue", ["RTE"])


def until_first_trial(env: dict[str, str], cwd: Path) -> float:
    """Seconds from launching the sweep to its first progress line with a running trial; then it is stopped."""
    cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "sweep", *COMMAND], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    printed = []
    try:
        for line in proc.stdout:
            printed.append(line)
            if " running" in line and " 0 running" not in line:
                return time.monotonic() - started
        raise RuntimeError("the sweep ended before a trial ran:\n" + "".join(printed[-30:]))
    finally:
        end_session(proc.pid)
        proc.wait()


def end_session(sid: int) -> None:
    """SIGKILL every process of the sweep's session: the driver and the local Ray it started, nothing else."""
    import psutil

    def in_session(p) -> bool:
        try:
            return os.getsid(p.pid) == sid
        except (ProcessLookupError, PermissionError):
            return False

    victims = [p for p in psutil.process_iter() if in_session(p)]
    for p in victims:
        p.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=30)


def timed(code: str, env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.monotonic() - started


def measure(hub, label: str, run) -> dict:
    before = (hub.bytes_served, sum(hub.file_gets.values()))
    seconds = run()
    row = {"case": label, "seconds": round(seconds, 1), "bytes": hub.bytes_served - before[0],
           "files": sum(hub.file_gets.values()) - before[1]}
    print(f"{label:<36} {row['seconds']:>7.1f} s {row['bytes'] / 2**20:>9.1f} MiB {row['files']:>4} file(s)",
          flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from sweep.testing.hub_repos import glue_files, model_files
    from sweep.testing.stand_in_hub import StandInHub

    with tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
        work = Path(tmp)
        hub = StandInHub()
        hub.add_repo("roberta-base", model_files(model_folder(args.size, work)))
        hub.add_repo("nyu-mll/glue", glue_files(data_folder(work), ("RTE",)), repo_type="dataset")
        with hub:
            sweep_env = {**hub.env(work / "hf-sweep"), "SWEEP_CACHE_DIR": str(work / "sweep-cache")}
            glue_env = hub.env(work / "hf-run-glue")
            first = until_first_trial
            rows = [measure(hub, "sweep: command -> first trial, cold", lambda: first(sweep_env, work / "a")),
                    measure(hub, "sweep: command -> first trial, warm", lambda: first(sweep_env, work / "b")),
                    measure(hub, "run_glue's loads, cold", lambda: timed(RUN_GLUE, glue_env)),
                    measure(hub, "run_glue's loads, warm", lambda: timed(RUN_GLUE, glue_env))]
    result = {"size": args.size, "rows": rows,
              "bytes_ratio_cold": round(rows[0]["bytes"] / max(rows[2]["bytes"], 1), 3)}
    print(f"bytes fetched cold, sweep / run_glue's loads: {result['bytes_ratio_cold']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
