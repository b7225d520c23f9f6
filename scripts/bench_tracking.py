"""What tracking costs a sweep: each trial logging its own nested MLflow run from its worker (the
old way, trial-side) vs the driver logging every trial's run from its Tune reports
(sweep/hooks/mlflow_runs.py's ``TrialRuns``, driver-side), on the same store in the same run.

For each store (a fresh ``sqlite:///`` file, and a real ``mlflow server`` subprocess over HTTP) a
parent run is made with ``SweepTracker`` (the server runs with ``--workers 1`` by default and
MLflow 3's job runner off, as it serves no tracking call) and the same TRIALS x EVALS evaluations are logged twice:

  before  the trials interleaved round-robin (one evaluation of each in turn), each with its own
          ``TrialLogger`` making its calls synchronously, as the old worker did: what a trial's
          loop was blocked per evaluation (``log_evaluation``: mean, p50, p95), per trial in all
          (start + evaluations + end), and the CPU those calls took (the trials' processes).
  after   the same evaluations fed to one ``TrialRuns`` through Tune's hooks (fake trial objects,
          reports shaped like ``EvaluationReporter.metrics``): what the trial pays (0: it reports to
          Tune anyway), the time Tune's event loop spends in the hooks per evaluation, the backlog
          (wall time from the last hook until ``close()`` returns), and the driver process's CPU
          per reported evaluation (``time.process_time``, background thread included).

Every measurement ends by counting, with ``MlflowClient``, the runs under its parent and each
metric's history points: a run or point missing (e.g. left in the spool) makes the script exit 1.
No Ray cluster is started (only ``ray.tune.Callback`` is imported). Reports are fed as fast as the
hooks take them, the worst case for the backlog.

With ``--models N``, each store also registers a task's best model N times both ways, on the same
exported folder (a tiny RoBERTa classifier, or ``--model-dir``): as loose run artifacts (``log_artifacts``
+ a ``runs:/`` version, how versions were registered before) and as an MLflow Model (``register_best``:
the transformers flavor, signature, input example). Reported per registration and, as a sweep pays it
once per task, per trial of a task with ``--trials`` trials, beside the trials' own logging.

    python scripts/bench_tracking.py                       # 8 trials x 20 evaluations, sqlite and server
    python scripts/bench_tracking.py --stores sqlite --trials 16 --evals 50
    python scripts/bench_tracking.py --models 5            # and the cost of the flavor logging
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil

from sweep.config.validate import compose_settings
from sweep.hooks.mlflow_runs import TrialRuns, evaluation_metrics, run_name
from sweep.results.trial_reports import CHECKPOINT_RANK, Report, checkpoint_rank
from sweep.testing.local_cluster import free_port
from sweep.tracking import SweepTracker, TrialLogger, TrialTracking

ROOT = Path(__file__).resolve().parents[1]
TASK = "WNLI"
STEPS_PER_EPOCH = 16  # the demo: 256 rows, batch 16
SERVER_START_S = 180.0  # a first start on a busy 2-core machine can take a minute


# --- the store -----------------------------------------------------------------------------------


class Server:
    """``mlflow server`` with a sqlite backend and proxied artifacts, on a free port of 127.0.0.1."""

    def __init__(self, root: Path, workers: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        entry = Path(sys.executable).with_name("mlflow")
        mlflow = [str(entry)] if entry.exists() else [sys.executable, "-m", "mlflow"]
        self.log = root / "server.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [*mlflow, "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers),
                 "--backend-store-uri", f"sqlite:///{root}/srv.db", "--artifacts-destination", str(root / "artifacts")],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # MLflow 3's job runner (seven idle, polling huey consumers) serves no tracking call:
                # off, so that it neither loads this machine nor counts in the server's CPU
                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {SERVER_START_S:.0f} s:\n{self.log.read_text()[-3000:]}")

    def cpu_s(self) -> float:
        """CPU seconds of the server and its uvicorn worker so far."""
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def new_parent(uri: str, experiment: str, spool: Path, name: str) -> TrialTracking:
    tracker = SweepTracker(uri, experiment, spool)
    parent = tracker.start({"bench": "tracking", "mode": name}, run_name=name)
    return TrialTracking(uri, tracker.experiment_id, parent, experiment, str(spool))


# --- the trials' reports ---------------------------------------------------------------------------


def trial_config(seed: int) -> dict[str, Any]:
    return {"trial": {"task": TASK, "seed": seed, "grid": {}}, "hparams": {}}


def report(trial_id: str, seed: int, i: int, evals: int, launch_id: str, config: dict[str, Any]) -> dict[str, Any]:
    """Evaluation ``i`` (0-based) of a trial, as ``EvaluationReporter.report_of`` reports it (one per epoch),
    with the keys Tune adds to every result."""
    steps_total = evals * STEPS_PER_EPOCH
    step = (i + 1) * STEPS_PER_EPOCH
    progress = step / steps_total
    score = 0.4 + 0.2 * progress + 0.001 * seed
    now = time.time()
    return {
        "trial_id": trial_id, "task": TASK, "seed": seed, "epoch": i + 1, "train_loss": 0.7 - 0.2 * progress,
        "score": score, "step": step, "steps_total": steps_total, "progress": progress, "end_of_epoch": True,
        "trivial_score": 0.4366, "rung": False, CHECKPOINT_RANK: checkpoint_rank(score, progress),
        "train_seconds": 1.5, "eval_seconds": 0.2, "train_tokens": 4096 * (i + 1),
        "node": "f" * 56, "node_ip": "10.0.0.7", "host": "worker-1", "device": "cuda:0 (NVIDIA H100)",
        "resumed": False, "launch_id": launch_id, "driver_started": now - 60, "process_started": now - 50,
        "imported": now - 45, "pid": 4242, "rss_at_start_mb": 512.0, "loop_started": now - 40, "reported_at": now,
        "eval/acc": score, "eval/eval_loss": 0.69 - 0.1 * progress,
        # what Tune adds to each result
        "training_iteration": i + 1, "time_this_iter_s": 1.7, "time_total_s": 1.7 * (i + 1), "timestamp": int(now),
        "date": time.strftime("%Y-%m-%d_%H-%M-%S"), "hostname": "worker-1", "done": False, "config": config,
        "time_since_restore": 1.7 * (i + 1), "iterations_since_restore": i + 1,
    }


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- the two ways --------------------------------------------------------------------------------


def before(tracking: TrialTracking, settings, trials: int, evals: int, launch_id: str) -> dict[str, Any]:
    """Trial-side: each trial's own TrialLogger, called synchronously (the old worker's calls)."""
    from dataclasses import asdict

    loggers, blocked, totals = [], [], [0.0] * trials
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for k in range(trials):
        trial_id, seed = f"bench{k:05d}", 100 + k
        logger = TrialLogger(
            tracking.uri, tracking.experiment_id, tracking.parent_run_id,
            run_name=run_name(TASK, seed, {}, trial_id, sampled=False),
            params={"task": TASK, "seed": seed, **asdict(settings.train)},
            tags={"sweep.trial_id": trial_id, "sweep.hparams": "{}"},
            experiment_name=tracking.experiment_name, spool_dir=tracking.spool_dir)
        t = time.perf_counter()
        logger.start()
        totals[k] += time.perf_counter() - t
        loggers.append((trial_id, seed, logger))
    for i in range(evals):
        for k, (trial_id, seed, logger) in enumerate(loggers):
            row = Report.from_row(report(trial_id, seed, i, evals, launch_id, {}))
            step, metrics = evaluation_metrics(row, settings.train)
            t = time.perf_counter()
            logger.log_evaluation(step, metrics)
            dt = time.perf_counter() - t
            blocked.append(dt)
            totals[k] += dt
    for k, (_, _, logger) in enumerate(loggers):
        t = time.perf_counter()
        logger.end("FINISHED")
        totals[k] += time.perf_counter() - t
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    n = trials * evals
    return {
        "trial_blocked_ms_per_eval": {"mean": ms(statistics.fmean(blocked)), "p50": ms(pct(blocked, 50)),
                                      "p95": ms(pct(blocked, 95)), "max": ms(max(blocked))},
        "trial_total_ms": {"mean": ms(statistics.fmean(totals)), "max": ms(max(totals))},
        "event_loop_ms_per_eval": 0.0, "driver_cpu_ms_per_eval": 0.0,
        "trial_cpu_ms_per_eval": ms(cpu / n), "wall_s": round(wall, 3), "backlog_s": 0.0, "evaluations": n,
    }


def after(tracking: TrialTracking, settings, trials: int, evals: int, launch_id: str) -> dict[str, Any]:
    """Driver-side: the same evaluations through one TrialRuns' Tune hooks, then close()."""
    runs = TrialRuns(settings, tracking, launch_id, rungs_board=None)
    fakes = [SimpleNamespace(trial_id=f"bench{k:05d}", config=trial_config(100 + k), last_result={})
             for k in range(trials)]
    hooks = {"on_trial_start": [], "on_trial_result": [], "on_trial_complete": []}
    iteration = 0

    def call(name: str, trial, **kw) -> None:
        nonlocal iteration
        iteration += 1
        t = time.perf_counter()
        getattr(runs, name)(iteration, fakes, trial, **kw)
        hooks[name].append(time.perf_counter() - t)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    for trial in fakes:
        call("on_trial_start", trial)
    for i in range(evals):
        for trial in fakes:
            result = report(trial.trial_id, trial.config["trial"]["seed"], i, evals, launch_id, trial.config)
            trial.last_result = result
            call("on_trial_result", trial, result=result)
    for trial in fakes:
        trial.last_result = {**trial.last_result, "done": True}
        call("on_trial_complete", trial)
    fed = time.perf_counter()
    runs.close()
    closed = time.perf_counter()
    cpu = time.process_time() - cpu0
    n = trials * evals
    results = hooks["on_trial_result"]
    in_hooks = sum(sum(v) for v in hooks.values())
    return {
        "trial_blocked_ms_per_eval": {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0},
        "trial_total_ms": {"mean": 0.0, "max": 0.0},
        "event_loop_ms_per_eval": ms(in_hooks / n),
        "on_trial_result_ms": {"mean": ms(statistics.fmean(results)), "p50": ms(pct(results, 50)),
                               "p95": ms(pct(results, 95)), "max": ms(max(results))},
        "hooks_ms_total": {k: ms(sum(v)) for k, v in hooks.items()},
        "busy_s": round(runs.busy_s, 6), "busy_ms_per_eval": ms(runs.busy_s / n),
        "driver_cpu_ms_per_eval": ms(cpu / n), "trial_cpu_ms_per_eval": 0.0,
        "feed_s": round(fed - wall0, 4), "backlog_s": round(closed - fed, 3), "wall_s": round(closed - wall0, 3),
        "evaluations": n,
    }


def check_complete(tracking: TrialTracking, settings, trials: int, evals: int) -> dict[str, Any]:
    """Count what the store holds under the parent: runs, their status, each metric's history points."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking.uri)
    keys = sorted(evaluation_metrics(Report.from_row(report("x", 0, 0, evals, "", {})), settings.train)[1])
    runs = client.search_runs([tracking.experiment_id], f"tags.mlflow.parentRunId = '{tracking.parent_run_id}'",
                              max_results=1000)
    points = sum(len(client.get_metric_history(r.info.run_id, key)) for r in runs for key in keys)
    finished = sum(r.info.status == "FINISHED" for r in runs)
    kept = sorted(p.name for p in Path(tracking.spool_dir).glob("*.jsonl")) if tracking.spool_dir else []
    want_points = trials * evals * len(keys)
    ok = len(runs) == trials and finished == trials and points == want_points and not kept
    return {"complete": ok, "runs": len(runs), "finished": finished, "points": points,
            "points_expected": want_points, "metrics": keys, "spooled_files": kept}


# --- one store -----------------------------------------------------------------------------------


def bench_store(store: str, work: Path, settings, args) -> dict[str, Any]:
    server = Server(work / "server", args.server_workers) if store == "server" else None
    uri = server.url if server else f"sqlite:///{work}/mlflow.db"
    try:
        experiment = f"bench-tracking-{store}"
        # warm-up: the store's tables, MLflow's lazy imports and the first connection, paid by neither mode
        warm = new_parent(uri, experiment, work / "spool-warm-up", "warm-up")
        before(warm, settings, 1, 2, "warm")
        out: dict[str, Any] = {"uri": uri}
        for mode, measure in (("before", before), ("after", after)):
            tracking = new_parent(uri, experiment, work / f"spool-{mode}", mode)
            launch_id = f"{mode}-{store}"
            server_cpu0 = server.cpu_s() if server else None
            row = measure(tracking, settings, args.trials, args.evals, launch_id)
            if server:
                row["server_cpu_ms_per_eval"] = ms((server.cpu_s() - server_cpu0) / row["evaluations"])
            row["store"] = check_complete(tracking, settings, args.trials, args.evals)
            s = row["store"]
            print(f"{store} {mode}: {s['runs']}/{args.trials} runs, {s['finished']} FINISHED, {s['points']}/"
                  f"{s['points_expected']} metric points ({len(s['metrics'])} metrics x {args.evals} evaluations each)"
                  f"{', spool holds ' + ', '.join(s['spooled_files']) if s['spooled_files'] else ''}: "
                  f"{'complete' if s['complete'] else 'INCOMPLETE'}", flush=True)
            out[mode] = row
        if args.models:
            out["models"] = bench_models(uri, args.model_dir, args.models)
        return out
    finally:
        if server:
            server.stop()


def bench_models(uri: str, model_dir: Path, repeats: int) -> dict[str, Any]:
    """Seconds per registration of ``model_dir``: loose artifacts vs the transformers flavor (median of ``repeats``)."""
    from mlflow import MlflowClient

    from sweep.config.tasks import load_task
    from sweep.tracking import ensure_experiment, register_best

    client = MlflowClient(uri, registry_uri=uri)
    experiment = ensure_experiment(client, "bench-models", uri)
    spec = load_task(TASK)

    def finished_run() -> str:
        run = client.create_run(experiment)
        client.set_terminated(run.info.run_id)
        return run.info.run_id

    def loose() -> None:
        run_id = finished_run()
        client.log_artifacts(run_id, str(model_dir), "model")
        client.create_model_version("bench-loose", f"runs:/{run_id}/model", run_id=run_id)

    client.create_registered_model("bench-loose")
    register_best(uri, "bench-warm-up", spec, finished_run(), model_dir, 0.5)  # pipeline imports, paid by neither
    times: dict[str, list[float]] = {"loose": [], "flavor": []}
    for _ in range(repeats):
        for mode, call in (("loose", loose),
                           ("flavor", lambda: register_best(uri, "bench", spec, finished_run(), model_dir, 0.5))):
            t0 = time.perf_counter()
            call()
            times[mode].append(time.perf_counter() - t0)
    return {mode: statistics.median(values) for mode, values in times.items()}


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=8, help="concurrent trials")
    p.add_argument("--evals", type=int, default=20, help="evaluations per trial")
    p.add_argument("--stores", nargs="+", choices=("sqlite", "server"), default=["sqlite", "server"])
    p.add_argument("--server-workers", type=int, default=1, help="mlflow server --workers")
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "tracking.json")
    p.add_argument("--models", type=int, default=0, help="also register a best model this many times each way")
    p.add_argument("--model-dir", type=Path, help="the exported model to register (default: a tiny classifier)")
    args = p.parse_args()

    # one evaluation per epoch, as the demo: the step logged is the epoch
    settings = compose_settings("experiment=demo", f"train.epochs={args.evals}")
    work = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    load0 = os.getloadavg()
    results: dict[str, Any] = {}
    try:
        if args.models and args.model_dir is None:
            from sweep.train.tiny_exports import export_tiny_classifier

            args.model_dir = export_tiny_classifier(work / "best" / TASK, work / "cache")
        if args.models:
            from sweep.disk import folder_size

            model_mib = folder_size(args.model_dir) / 2**20  # now: the work folder goes at the end
        for store in args.stores:
            t0 = time.perf_counter()
            results[store] = bench_store(store, work / store, settings, args)
            print(f"{store}: {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{args.trials} trials x {args.evals} evaluations = {args.trials * args.evals} reports per mode "
          f"(load average {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end, {os.cpu_count()} CPUs)")
    head = (f"{'store':<7} {'mode':<7} {'trial blocked ms/eval':>22} {'event loop':>11} {'driver CPU':>11} "
            f"{'trial CPU':>10} {'server CPU':>11} {'wall s':>7} {'backlog s':>10}  runs complete")
    print(head)
    print(f"{'':<7} {'':<7} {'mean / p50 / p95':>22} {'ms/eval':>11} {'ms/eval':>11} {'ms/eval':>10} {'ms/eval':>11}")
    for store, r in results.items():
        for mode in ("before", "after"):
            m = r[mode]
            b = m["trial_blocked_ms_per_eval"]
            blocked = f"{b['mean']:.2f} / {b['p50']:.2f} / {b['p95']:.2f}" if mode == "before" else "0"
            server_cpu = f"{m['server_cpu_ms_per_eval']:.2f}" if "server_cpu_ms_per_eval" in m else "-"
            s = m["store"]
            print(f"{store:<7} {mode:<7} {blocked:>22} {m['event_loop_ms_per_eval']:>11.3f} "
                  f"{m['driver_cpu_ms_per_eval']:>11.2f} {m['trial_cpu_ms_per_eval']:>10.2f} {server_cpu:>11} "
                  f"{m['wall_s']:>7.2f} {m['backlog_s']:>10.2f}  {s['runs']}/{args.trials} "
                  f"{'yes' if s['complete'] else 'NO'}")
    print()
    print("before: the trials' own calls; a trial's loop waited for each (per trial in all, start + evaluations "
          "+ end: " + ", ".join(f"{st} {r['before']['trial_total_ms']['mean']:.0f} ms" for st, r in results.items())
          + "); the trial CPU ran in the trials' processes, the driver paid nothing.")
    print("after: a trial blocks 0 ms: it reports each evaluation to Tune anyway (checkpoint, rungs) and the MLflow "
          "calls run on the driver's thread; event loop = all of TrialRuns' hooks / evaluations "
          "(on_trial_result p95: " + ", ".join(f"{st} {r['after']['on_trial_result_ms']['p95']:.3f} ms"
                                               for st, r in results.items())
          + "; busy_s / evaluations: " + ", ".join(f"{st} {r['after']['busy_ms_per_eval']:.3f} ms"
                                                 for st, r in results.items())
          + "); driver CPU includes the background thread; backlog = last hook -> close() returned.")
    print()
    ratios = {}
    print(f"{'store':<7} {'driver-side / trial-side:':<26} {'blocked per eval':>17} {'event loop / trial blocked':>27} "
          f"{'CPU per eval':>13} {'wall':>7}")
    for store, r in results.items():
        b, a = r["before"], r["after"]
        ratios[store] = {
            "trial_blocked": 0.0,
            "event_loop_vs_trial_blocked": ratio(a["event_loop_ms_per_eval"], b["trial_blocked_ms_per_eval"]["mean"]),
            "driver_cpu_vs_trial_cpu": ratio(a["driver_cpu_ms_per_eval"], b["trial_cpu_ms_per_eval"]),
            "wall": ratio(a["wall_s"], b["wall_s"]),
        }
        x = ratios[store]
        print(f"{store:<7} {'':<26} {0:>16.2f}x {x['event_loop_vs_trial_blocked']:>26.4f}x "
              f"{x['driver_cpu_vs_trial_cpu']:>12.2f}x {x['wall']:>6.2f}x")

    if args.models:
        print()
        print(f"registering the best model ({args.model_dir}, {model_mib:.1f} MiB), median of {args.models}: per "
              f"registration, and per trial of a task of {args.trials} trials (one registration per task)")
        print(f"{'store':<7} {'loose s':>8} {'flavor s':>9} {'flavor/loose':>13} {'flavor per trial ms':>20} "
              f"{'trial logging per trial ms':>27}")
        for store, r in results.items():
            m = r["models"]
            own = r["after"]["driver_cpu_ms_per_eval"] * args.evals  # the driver's CPU for one trial's evaluations
            print(f"{store:<7} {m['loose']:>8.3f} {m['flavor']:>9.3f} {m['flavor'] / m['loose']:>12.2f}x "
                  f"{m['flavor'] / args.trials * 1000:>20.1f} {own:>27.1f}")

    complete = all(r[m]["store"]["complete"] for r in results.values() for m in ("before", "after"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "trials": args.trials, "evals": args.evals, "server_workers": args.server_workers, "host": platform.node(),
        "cpus": os.cpu_count(), "load_average_start": load0, "load_average_end": os.getloadavg(),
        "complete": complete, "stores": results, "ratios_driver_vs_trial": ratios,
    }, indent=2))
    print(f"written {args.out}")
    if not complete:
        print("error: some runs in the store are incomplete (see the lines above)", file=sys.stderr)
        return 1
    print("every run holds every evaluation in every store")
    return 0


if __name__ == "__main__":
    sys.exit(main())
