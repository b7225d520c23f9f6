"""A Locust load test of ``sweep serve`` with its guards on (issue 55): no 5xx, no stuck worker, and the guards' cost.

    python scripts/bench_load.py                    # users 1, 8, 32; 4 repeats of 10 s each; every mode
    python scripts/bench_load.py --quick            # a smoke run: users 1 and 8, 5 s each (1-2 minutes)
    python scripts/bench_load.py --users 4 --duration 4 --modes guarded+abuse   # what tests/test_bench_load.py runs

Starts two pairs of real ``python -m sweep serve`` processes, REST only, side by side for the whole run: the tiny
RoBERTa RTE classifier and the tiny GPT-2, once **guarded** (``api_key=`` set, every limit at its default: body
8 MiB / 16 MiB, ``request_timeout_s=300``, ``max_output_tokens`` = the context) and once **unguarded** (no key,
``request_timeout_s=0``, ``max_body_bytes`` 1 GiB; ``max_output_tokens`` stays the context, which no option can
lift). Then, per user count (closed loop: each Locust user sends its next request when the last is answered, on
its own keep-alive connection), ``--repeats`` times in alternating order (A B C, C B A, ...: drift on a shared
machine hits every mode alike), each step ``--duration`` seconds after ``--warmup``; the repeats are pooled:

- ``unguarded``: the normal mix against the unguarded pair: v2 infer on the classifier (``POST
  /v2/models/NAME/infer``, one sentence pair) and OpenAI completions on GPT-2 (``POST /openai/v1/completions``,
  ``max_tokens`` 16, greedy), half each; every answer must be 200;
- ``guarded``: the same mix against the guarded pair, with ``Authorization: Bearer <key>``: the guards' cost is
  guarded / unguarded (requests/s of the normal requests, each route's p50 and p99);
- ``guarded+abuse``: the same, plus a small share of abusive requests in the same load (weights 1 each against the
  normal routes' 20): a 10 MB v2 body to the classifier (must be 413), a request without the key, to either model
  (must be 401), and a completion asking 10,000 tokens of a 256-token context (must be 400).

Any 5xx, connection error, or a status other than the one its request must get is a failure. After every step:
both servers' ``/v2/health/ready`` and a normal request to each must answer 200 (and, guarded, a 10 MB body 413
and a keyless request 401), and each server's RSS (its process and its children: GPT-2's decoding process) is
read. Exit 1 on any failure.

Locust runs as a library (``locust.env.Environment``, a local runner, its stats), in a subprocess of this script
per step: importing locust monkey-patches the process with gevent, which this process (and the servers) must not
be. Latency percentiles are computed from every request's own time (Locust's own stats round them; its counts
and percentiles are kept in the JSON beside). On a 2-core machine the Locust process takes CPU from the servers
alike in every mode; its CPU warning (over 90 %) is recorded per step.

Writes ``--out`` (bench_results/load.json) and prints a table per (users, mode) and the ratios to unguarded, with the
spread of the repeats' own ratios (the noise of the machine it ran on).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLASSIFIER = "tiny-roberta-RTE"
LM = "tiny-gpt2-wikitext-2"
LM_CONTEXT = 256  # the tiny GPT-2's positions (conf/model/tiny-gpt2.yaml)
MAX_TOKENS = 16  # a completion's tokens in the normal mix
OVERSIZED_BYTES = 10_000_000  # over the classifier's default 8 MiB
UNGUARDED_MAX_BODY = 2**30
MODES = ("unguarded", "guarded", "guarded+abuse")
NORMAL = ("classify", "complete")
ABUSE = ("oversized", "no_key", "too_many_tokens")
# the request kinds of the mix: their Locust task weights, and the status each must get
WEIGHTS = {"classify": 20, "complete": 20, "oversized": 1, "no_key": 1, "too_many_tokens": 1}
EXPECTED = {"classify": 200, "complete": 200, "oversized": 413, "no_key": 401, "too_many_tokens": 400}


def classify_body(i: int) -> dict[str, Any]:
    text = {"name": "text", "shape": [1], "datatype": "BYTES"}
    return {"inputs": [{**text, "data": [f"the {i} old painters see {i % 13} quiet rivers near the village"]},
                       {**text, "name": "text_pair", "data": [f"{i % 13} rivers are quiet"]}]}


def complete_body(i: int, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {"model": LM, "prompt": f"story {i}: the teacher", "max_tokens": max_tokens, "temperature": 0}


def oversized_body() -> bytes:
    """A well-formed v2 request of ``OVERSIZED_BYTES``: one text that long (a server without a limit reads it)."""
    head, tail = b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["', b'"]}]}'
    return head + b"x" * (OVERSIZED_BYTES - len(head) - len(tail)) + tail


# ---- one load step, in a subprocess of its own (gevent) ------------------------------------------------------


def locust_step(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec['users']`` closed-loop Locust users for ``spec['duration']`` s after ``spec['warmup']`` s."""
    import logging
    import random

    import gevent
    from locust import HttpUser, constant
    from locust.env import Environment

    logging.getLogger("locust").setLevel(logging.ERROR)
    random.seed(spec["seed"])
    classifier_url, lm_url, key = spec["classifier_url"], spec["lm_url"], spec["key"]
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    big = oversized_body() if spec["abuse"] else b""
    counter = iter(range(10**9))

    def call(user: HttpUser, kind: str, url: str, expected: int, **kwargs: Any) -> None:
        with user.client.post(url, name=kind, catch_response=True, timeout=120, **kwargs) as response:
            if response.status_code == expected:
                response.success()
            else:
                response.failure(f"status {response.status_code}, expected {expected}: {response.text[:200]}")

    def classify(user: HttpUser) -> None:
        call(user, "classify", f"/v2/models/{CLASSIFIER}/infer", 200, json=classify_body(next(counter)), headers=auth)

    def complete(user: HttpUser) -> None:
        call(user, "complete", f"{lm_url}/openai/v1/completions", 200, json=complete_body(next(counter)),
             headers=auth)

    def oversized(user: HttpUser) -> None:
        call(user, "oversized", f"/v2/models/{CLASSIFIER}/infer", 413, data=big,
             headers={**auth, "Content-Type": "application/json"})

    def no_key(user: HttpUser) -> None:
        i = next(counter)
        if i % 2:
            call(user, "no_key", f"/v2/models/{CLASSIFIER}/infer", 401, json=classify_body(i))
        else:
            call(user, "no_key", f"{lm_url}/openai/v1/completions", 401, json=complete_body(i))

    def too_many_tokens(user: HttpUser) -> None:
        call(user, "too_many_tokens", f"{lm_url}/openai/v1/completions", 400,
             json=complete_body(next(counter), 10_000), headers=auth)

    functions = {"classify": classify, "complete": complete, "oversized": oversized, "no_key": no_key,
                 "too_many_tokens": too_many_tokens}
    weights = {kind: WEIGHTS[kind] for kind in NORMAL} | (dict.fromkeys(ABUSE, spec["abuse_weight"])
                                                          if spec["abuse"] else {})
    tasks = {functions[kind]: weight for kind, weight in weights.items() if weight}
    user_class = type("LoadUser", (HttpUser,), {"host": classifier_url, "wait_time": constant(0), "tasks": tasks})
    env = Environment(user_classes=[user_class])
    records: list[tuple[str, int, float]] = []  # (kind, status, ms); status 0: no answer (a connection error)

    def on_request(name: str, response_time: float, response: Any = None, **_: Any) -> None:
        records.append((name, getattr(response, "status_code", 0) or 0, response_time))

    env.events.request.add_listener(on_request)
    runner = env.create_local_runner()
    runner.start(spec["users"], spawn_rate=max(spec["users"], 1))
    deadline = time.monotonic() + 60
    while runner.user_count < spec["users"] and time.monotonic() < deadline:
        gevent.sleep(0.1)
    gevent.sleep(spec["warmup"])
    records.clear()
    runner.stats.reset_all()
    started = time.perf_counter()
    gevent.sleep(spec["duration"])
    measured, wall = list(records), time.perf_counter() - started
    locust_stats = {name: {"requests": entry.num_requests, "failures": entry.num_failures,
                           "p50_ms": entry.get_response_time_percentile(0.5),
                           "p99_ms": entry.get_response_time_percentile(0.99)}
                    for (name, _method), entry in runner.stats.entries.items()}
    failures = sorted({f"{e.name}: {e.error}" for e in runner.stats.errors.values()})[:20]
    exceptions = [f"{e['msg']} ({e['count']}x)" for e in runner.exceptions.values()]
    cpu_warning = runner.cpu_warning_emitted
    runner.quit()
    return {"wall_s": wall, "records": measured, "locust": locust_stats, "locust_failures": failures,
            "exceptions": exceptions, "locust_cpu_over_90": cpu_warning}


# ---- the servers, the checks, the run --------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (GPT-2's decoding process), MiB."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return round(total / 2**20, 1)


class Pair:
    """A classifier server and a GPT-2 server, guarded or not."""

    def __init__(self, guarded: bool, models: dict[str, Path], root: Path, key: str) -> None:
        from sweep.testing.local_cluster import free_port

        self.guarded, self.key = guarded, key if guarded else ""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self.logs: dict[str, Path] = {}
        env = {**os.environ, "SWEEP_CACHE_DIR": str(root / "cache"), "HF_HUB_OFFLINE": "1"}
        env.pop("SWEEP_API_KEY", None)
        limits = [f"api_key={key}"] if guarded else ["request_timeout_s=0", f"max_body_bytes={UNGUARDED_MAX_BODY}"]
        for name, model_dir in models.items():
            port = free_port()
            while any(url.endswith(f":{port}") for url in self.urls.values()):
                port = free_port()
            self.logs[name] = root / f"{'guarded' if guarded else 'unguarded'}-{name}.log"
            with self.logs[name].open("wb") as sink:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "sweep", "serve", f"model={model_dir}", f"port={port}", "grpc=false",
                     "log_requests=false", *limits], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            self.urls[name] = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout_s: float = 240) -> None:
        from sweep.testing.services import wait_until_serving

        deadline = time.monotonic() + timeout_s
        for name, url in self.urls.items():  # started together: the second waits what is left of the time
            wait_until_serving(url, self.procs[name], self.logs[name], max(deadline - time.monotonic(), 1.0))

    def rss(self) -> dict[str, float]:
        return {name: rss_mib(proc.pid) for name, proc in self.procs.items()}

    def check(self) -> dict[str, Any]:
        """Still serving: health, a normal request to each (200), and the guards (413, 401); each's status and ms."""
        import httpx

        auth = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        infer = f"{self.urls['classifier']}/v2/models/{CLASSIFIER}/infer"
        completions = f"{self.urls['lm']}/openai/v1/completions"
        asks: list[tuple[str, int, Any]] = [
            ("classifier ready", 200, lambda c: c.get(f"{self.urls['classifier']}/v2/health/ready")),
            ("lm ready", 200, lambda c: c.get(f"{self.urls['lm']}/v2/health/ready")),
            ("classify", 200, lambda c: c.post(infer, json=classify_body(7), headers=auth)),
            ("complete", 200, lambda c: c.post(completions, json=complete_body(7), headers=auth)),
        ]
        if self.guarded:
            asks += [("oversized", 413, lambda c: c.post(infer, content=oversized_body(),
                                                         headers={**auth, "Content-Type": "application/json"})),
                     ("no_key", 401, lambda c: c.post(infer, json=classify_body(7)))]
        out: dict[str, Any] = {}
        for label, expected, ask in asks:
            start = time.perf_counter()
            try:
                with httpx.Client(timeout=30) as client:
                    status = ask(client).status_code
            except httpx.HTTPError as error:
                status = f"{type(error).__name__}: {error}"
            out[label] = {"status": status, "expected": expected, "ms": round(1000 * (time.perf_counter() - start), 1)}
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def code_state() -> dict[str, Any]:
    """The commit measured, and the server's files that differed from it (a shared working tree)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True).stdout.rstrip()

    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "sweep/serving", "sweep/cli/serve.py").splitlines()}


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(raw: dict[str, Any], mode: str, users: int) -> dict[str, Any]:
    """Requests/s, percentiles per kind, status counts, and what went wrong."""
    wall = raw["wall_s"]
    by_kind: dict[str, list[float]] = {}
    statuses: dict[str, dict[str, int]] = {}
    unexpected: dict[str, dict[str, int]] = {}
    for kind, status, ms in raw["records"]:
        by_kind.setdefault(kind, []).append(ms)
        counts = statuses.setdefault(kind, {})
        counts[str(status)] = counts.get(str(status), 0) + 1
        if status != EXPECTED[kind]:
            bad = unexpected.setdefault(kind, {})
            bad[str(status)] = bad.get(str(status), 0) + 1
    kinds = {}
    for kind, times in sorted(by_kind.items()):
        ordered = sorted(times)
        kinds[kind] = {"requests": len(ordered), "requests_per_s": round(len(ordered) / wall, 1),
                       "p50_ms": round(statistics.median(ordered), 2), "p99_ms": round(percentile(ordered, 0.99), 2)}
    normal = sorted(ms for kind, _, ms in raw["records"] if kind in NORMAL)
    five_xx = sum(1 for _, status, _ in raw["records"] if status >= 500)
    no_answer = sum(1 for _, status, _ in raw["records"] if status == 0)
    return {"mode": mode, "users": users, "wall_s": round(wall, 2), "requests": len(raw["records"]),
            "normal_requests_per_s": round(len(normal) / wall, 1),
            "all_requests_per_s": round(len(raw["records"]) / wall, 1),
            "normal_p50_ms": round(statistics.median(normal), 2) if normal else None,
            "normal_p99_ms": round(percentile(normal, 0.99), 2) if normal else None,
            "kinds": kinds, "statuses": statuses, "unexpected": unexpected, "five_xx": five_xx,
            "no_answer": no_answer, "locust": raw["locust"], "locust_failures": raw["locust_failures"],
            "exceptions": raw["exceptions"], "locust_cpu_over_90": raw["locust_cpu_over_90"]}


def run_step(pair: Pair, mode: str, users: int, args: argparse.Namespace, root: Path, seed: int) -> dict[str, Any]:
    """One step's raw Locust result (every request's kind, status and ms)."""
    spec = {"classifier_url": pair.urls["classifier"], "lm_url": pair.urls["lm"], "key": pair.key,
            "abuse": mode == "guarded+abuse", "abuse_weight": args.abuse_weight, "users": users,
            "duration": args.duration, "warmup": args.warmup, "seed": seed}
    spec_path, out_path = root / f"step-{seed}.json", root / f"step-{seed}-out.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, __file__, "--locust-step", str(spec_path), str(out_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=args.duration + args.warmup + 240)
    if done.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"the Locust step failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(out_path.read_text())


def merged(raws: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats of one (users, mode) as one run: their requests pooled, their clocks added."""
    return {"wall_s": sum(r["wall_s"] for r in raws), "records": [rec for r in raws for rec in r["records"]],
            "locust": [r["locust"] for r in raws], "locust_failures": [f for r in raws for f in r["locust_failures"]],
            "exceptions": [e for r in raws for e in r["exceptions"]],
            "locust_cpu_over_90": any(r["locust_cpu_over_90"] for r in raws)}


def step_failures(step: dict[str, Any]) -> list[str]:
    where = f"{step['mode']} at {step['users']} users"
    found = [f"{where}: {kind} answered {counts} (must be {EXPECTED[kind]})"
             for kind, counts in step["unexpected"].items()]
    found += [f"{where}: Locust user exception {e}" for e in step["exceptions"]]
    found += [f"{where}: after the step, {label} answered {c['status']} (must be {c['expected']})"
              for label, c in step["check"].items() if c["status"] != c["expected"]]
    if not step["requests"]:
        found.append(f"{where}: no request answered")
    return found


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def ratios(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per user count: guarded / unguarded and guarded+abuse / unguarded, requests/s and each route's p50, p99."""
    out = []
    for users in sorted({c["users"] for c in cells}):
        at = {c["mode"]: c for c in cells if c["users"] == users}
        base = at.get("unguarded")
        if not base:
            continue
        for mode in ("guarded", "guarded+abuse"):
            if mode not in at:
                continue
            row: dict[str, Any] = {"users": users, "mode": mode, "normal_requests_per_s": ratio(
                at[mode]["normal_requests_per_s"], base["normal_requests_per_s"])}
            for kind in NORMAL:
                for q in ("p50_ms", "p99_ms"):
                    row[f"{kind}_{q.removesuffix('_ms')}"] = ratio(at[mode]["kinds"].get(kind, {}).get(q),
                                                                   base["kinds"].get(kind, {}).get(q))
            out.append(row)
    return out


def print_tables(cells: list[dict[str, Any]], rows: list[dict[str, Any]], rss_start: dict[str, Any]) -> None:
    print(f"\nRSS at the start (MiB): {json.dumps(rss_start)}")
    print(f"{'users':>5} {'mode':<14} {'normal req/s':>12} {'classify p50/p99 ms':>20} {'complete p50/p99 ms':>20} "
          f"{'5xx':>4}  statuses; checks after the steps; RSS after (MiB)")
    for c in cells:
        cols = [f"{c['kinds'].get(k, {}).get('p50_ms', '-')}/{c['kinds'].get(k, {}).get('p99_ms', '-')}"
                for k in NORMAL]
        statuses = ", ".join(f"{k} {'/'.join(f'{n}x{code}' for code, n in v.items())}"
                             for k, v in c["statuses"].items())
        rss = ", ".join(f"{k} {v}" for k, v in c["rss_after"].items())
        warn = " (Locust CPU > 90 %)" if c["locust_cpu_over_90"] else ""
        print(f"{c['users']:>5} {c['mode']:<14} {c['normal_requests_per_s']:>12} {cols[0]:>20} {cols[1]:>20} "
              f"{c['five_xx']:>4}  {statuses}; {c['checks_ok']}; {rss}{warn}")
    if rows:
        print("\nratios to unguarded (requests/s; p50, p99 per route):")
        for r in rows:
            spread = {q: f" ({min(v)}-{max(v)})" if len(v) > 1 and None not in v else ""
                      for q, v in r.get("per_repeat", {}).items()}
            print(f"{r['users']:>5} {r['mode']:<14} " + "  ".join(
                f"{q.replace('normal_requests_per_s', 'req/s')} {r[q]}{spread.get(q, '')}"
                for q in r if q not in ("users", "mode", "per_repeat")))
        print("(pooled over the repeats; in brackets the lowest and highest of the repeats' own ratios)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=None, help="closed-loop users per step (1 8 32)")
    parser.add_argument("--duration", type=float, default=None, help="seconds measured per step (10)")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of load before the clock (3)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="steps per (users, mode), in alternating order, pooled (4; --quick 1)")
    parser.add_argument("--abuse-weight", type=int, default=WEIGHTS["oversized"],
                        help="each abusive kind's task weight, against 20 for each normal route (1)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--quick", action="store_true", help="users 1 8, 5 s each, 1 s warm-up, 1 repeat")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_results" / "load.json")
    parser.add_argument("--locust-step", nargs=2, type=Path, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.locust_step:
        spec, out = args.locust_step
        out.write_text(json.dumps(locust_step(json.loads(spec.read_text()))))
        return 0
    args.users = args.users or ([1, 8] if args.quick else [1, 8, 32])
    args.duration = args.duration or (5.0 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0)
    args.repeats = args.repeats or (1 if args.quick else 4)

    from sweep.train.tiny_exports import export_tiny_classifier, export_tiny_lm

    started = time.monotonic()
    key = secrets.token_hex(24)
    raws: dict[tuple[int, str], list[dict[str, Any]]] = {}
    steps: list[dict[str, Any]] = []  # per repeat: its summary, the checks after it, RSS after it
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = {"classifier": export_tiny_classifier(root / "best" / "RTE", root / "cache"),
                  "lm": export_tiny_lm(root / "best" / "wikitext-2", root / "cache")}
        wanted = {"guarded": any(m.startswith("guarded") for m in args.modes), "unguarded": "unguarded" in args.modes}
        pairs = {name: Pair(name == "guarded", models, root, key) for name, want in wanted.items() if want}
        try:
            for pair in pairs.values():
                pair.wait_ready()
            rss_start = {name: pair.rss() for name, pair in pairs.items()}
            turn = 0
            for users in args.users:
                for repeat in range(args.repeats):
                    for mode in (args.modes if turn % 2 == 0 else list(reversed(args.modes))):
                        pair = pairs["unguarded" if mode == "unguarded" else "guarded"]
                        raw = run_step(pair, mode, users, args, root, seed=len(steps))
                        raws.setdefault((users, mode), []).append(raw)
                        step = {**summarize(raw, mode, users), "repeat": repeat, "check": pair.check(),
                                "rss_after": pair.rss()}
                        steps.append(step)
                        print(f"{mode} at {users} users (repeat {repeat}): {step['normal_requests_per_s']} normal "
                              f"req/s, statuses {step['statuses']}, 5xx {step['five_xx']}", flush=True)
                    turn += 1
        finally:
            for pair in pairs.values():
                pair.stop()
    cells = []
    for (users, mode), runs in sorted(raws.items(), key=lambda item: (item[0][0], MODES.index(item[0][1]))):
        own = [s for s in steps if s["users"] == users and s["mode"] == mode]
        checks = [c["status"] == c["expected"] for s in own for c in s["check"].values()]
        cells.append({**summarize(merged(runs), mode, users), "repeats": len(runs),
                      "checks_ok": f"{sum(checks)}/{len(checks)} checks ok", "rss_after": own[-1]["rss_after"]})
    rows = ratios(cells)
    per_repeat = [r | {"repeat": repeat} for repeat in range(args.repeats)
                  for r in ratios([s for s in steps if s["repeat"] == repeat])]
    for row in rows:  # the spread of the repeats' own ratios: this machine's noise, beside the pooled figure
        own = [r for r in per_repeat if (r["users"], r["mode"]) == (row["users"], row["mode"])]
        row["per_repeat"] = {q: [r[q] for r in own] for q in row if q not in ("users", "mode")}
    failures = [f for s in steps for f in step_failures(s)]
    for step in steps:  # Locust's own figures stay in the cells
        step.pop("locust")
    result = {"config": {"users": args.users, "duration_s": args.duration, "warmup_s": args.warmup,
                         "repeats": args.repeats, "modes": args.modes, "weights": WEIGHTS,
                         "abuse_weight": args.abuse_weight, "expected": EXPECTED,
                         "max_tokens": MAX_TOKENS, "oversized_bytes": OVERSIZED_BYTES, "cpus": os.cpu_count(),
                         "load_average_at_end": os.getloadavg(), **code_state()},
              "rss_start_mib": rss_start, "cells": cells, "ratios": rows, "ratios_per_repeat": per_repeat,
              "steps": steps, "five_xx": sum(c["five_xx"] for c in cells), "failures": failures,
              "wall_s": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print_tables(cells, rows, rss_start)
    print(f"\n{len(failures)} failure(s); {result['five_xx']} 5xx; {result['wall_s']} s; wrote {args.out}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
