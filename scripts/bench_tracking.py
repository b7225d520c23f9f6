"""Time a sweep spends on tracking: the same small sweep with tracking=none, the sqlite store, and
a real `mlflow server` over HTTP, in one run (ratios to tracking=none).

    python scripts/bench_tracking.py            # 2 seeds of the demo sweep per store
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root}/srv.db", "--artifacts-destination", str(root / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("mlflow server did not start")


def sweep(work: Path, name: str, tracking: list[str], seeds: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweep", "experiment=demo", f"sweep.seeds={seeds}", "train.epochs=2",
                    f"out_dir={work / name}", *tracking], cwd=work, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="[38,39]")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "tracking.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    sweep(work, "warm-up", ["tracking=none"], "[38]")  # builds the tiny model and data caches
    server, url = start_server(work / "server")
    try:
        times = {
            "none": sweep(work, "none", ["tracking=none"], args.seeds),
            "sqlite": sweep(work, "sqlite", [f"tracking.uri=sqlite:///{work}/mlflow.db"], args.seeds),
            "server": sweep(work, "server", [f"tracking.uri={url}"], args.seeds),
        }
    finally:
        server.terminate()
    print(f"{'tracking':<8} {'sweep wall s':>13} {'vs none':>8} {'added s':>8}")
    for name, seconds in times.items():
        print(f"{name:<8} {seconds:>13.1f} {seconds / times['none']:>7.2f}x {seconds - times['none']:>8.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seeds": args.seeds, "wall_s": times}, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
