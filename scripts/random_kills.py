"""Random kills: a sweep whose whole RayCluster is killed (SIGKILL, the head's disk wiped, S3 kept) at
random instants, several times in a row, then run to its end on a new cluster; and whether every trial
ended exactly once.

The sweep (WNLI x 4 seeds, a tiny RoBERTa, synthetic rows, resume=auto) runs on a local cluster of a head
and one GPU worker node with its own disk, with S3 from moto_server (sweep/testing/random_kills.py). Each
sweep (a fresh root and bucket) is killed ``--rounds-per-sweep`` times in a row, then runs to its end; the
kill instants alternate between kinds, each drawn by a seeded ``random.Random``:

- ``random``: uniform in [1 s, T] after the command started (T: the unkilled run's duration);
- ``checkpoint-upload``: the first upload of a trial's checkpoint to S3 after such an instant (T: the
  unkilled run's last checkpoint upload);
- ``state-upload``: the first upload of Tune's or the searcher's state, or of the ledger, after one (T: the
  unkilled run's last such upload).

A sweep that ends before its kill instant counts that instant as tried (not landed) and leaves its other kinds
to the next sweep.

Checked after each sweep: exit 0 without a traceback, one record per seed (every step trained), the best
model exported, one history per trial in S3 with each epoch once, no finished trial written again, and in
the MLflow store copied to S3 one FINISHED parent with one FINISHED run per seed (each evaluation once) and
one model version. First, ONE unkilled sweep (the same command) as the baseline: the time a resume adds is
the killed sweep's command seconds (every round) minus the unkilled run's. Exit status 1 on any violation;
the outputs of every round of a sweep with one are kept beside ``--out`` (``random_kills-logs/sweep-N/``).

    python scripts/random_kills.py                          # 20 kills: 7 sweeps, about 25 minutes on 2 cores
    python scripts/random_kills.py --kills 6 --rounds-per-sweep 2 --seed 3 --out random_kills.json

Starting a cluster ends EVERY Ray process on the machine (``ray stop --force``): run it alone.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from sweep.testing.local_cluster import namespace_refused
from sweep.testing.random_kills import AT_RANDOM, KILL_KINDS, UPLOAD_KINDS, KillRounds, KillRoundsResult

SEEDS = (1, 2, 3, 4)


def say(text: str) -> None:
    print(f"random_kills: {text}", flush=True)


def unkilled(root: Path, args: argparse.Namespace) -> tuple[KillRoundsResult, dict[str, float]]:
    """The baseline: the same command on a fresh root, run once to its end; and each kind's latest draw:
    the run's duration (random), its last upload of that kind (the others: a later draw never lands)."""
    rounds = KillRounds(root, SEEDS, args.epochs, args.rows)
    try:
        result = rounds.run([], random.Random(args.seed), max_s=1.0, timeout=args.timeout)
        latest = {kind: rounds.last_upload_s(kind) or rounds.final_s for kind in UPLOAD_KINDS}
        return result, {AT_RANDOM: rounds.final_s, **latest}
    finally:
        rounds.close()


def killed(root: Path, kinds: list[str], rng: random.Random, latest: dict[str, float], args: argparse.Namespace,
           number: int) -> KillRoundsResult:
    """One sweep killed once per kind (until it ends by itself), then run to its end; each kill's line
    printed as it happens."""
    rounds = KillRounds(root, SEEDS, args.epochs, args.rows)
    try:
        rounds.start()
        for kind in kinds:
            record = rounds.round(kind, rng, latest[kind])
            say(f"sweep {number} kill {len(rounds.kills)}: {record.line()}")
            if record.ended_first:
                break
        code = rounds.finish(args.timeout)
        violations = rounds.verify()
        say(f"sweep {number}: final exit {code} after {rounds.final_s:.1f} s, {len(violations)} violation(s)")
        for line in violations:
            say(f"  {line}")
        if violations:  # every round's output kept: the temporary root goes at the end
            kept = args.out.with_name(f"{args.out.stem}-logs") / f"sweep-{number}"
            shutil.copytree(rounds.logs, kept, dirs_exist_ok=True)
            say(f"  every round's output kept in {kept}; the final run's output ends:\n{rounds.final_log_tail(2000)}")
        return rounds.result(violations)
    finally:
        rounds.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20, help="kill instants in all")
    p.add_argument("--rounds-per-sweep", type=int, default=3, help="kills in a row before a sweep may finish")
    p.add_argument("--seed", type=int, default=0, help="draws the kill instants")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rows", type=int, default=64, help="training rows (synthetic WNLI)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the final run of a sweep may take")
    p.add_argument("--out", type=Path, default=Path("random_kills.json"), help="the report as JSON")
    args = p.parse_args()
    refused = namespace_refused()
    if refused:
        raise SystemExit(f"random_kills: a worker node with its own disk needs a mount namespace: {refused}")

    rng = random.Random(args.seed)
    kinds = [KILL_KINDS[i % len(KILL_KINDS)] for i in range(args.kills)]  # round-robin
    began = time.monotonic()
    sweeps: list[KillRoundsResult] = []
    with tempfile.TemporaryDirectory(prefix="sweep-random-kills-") as tmp:
        baseline, latest = unkilled(Path(tmp) / "unkilled", args)
        say(f"unkilled: exit {baseline.final_exit} after {baseline.final_s:.1f} s, "
            f"{len(baseline.violations)} violation(s) {baseline.violations or ''}; instants drawn up to "
            + ", ".join(f"{kind} {s:.1f} s" for kind, s in latest.items()))
        while kinds:  # a sweep that ended before its kill leaves its other kinds to the next sweep
            sweep = killed(Path(tmp) / f"sweep-{len(sweeps) + 1}", kinds[:args.rounds_per_sweep], rng, latest, args,
                           len(sweeps) + 1)
            sweeps.append(sweep)
            kinds = kinds[len(sweep.kills):]

    added = [s.command_s - baseline.final_s for s in sweeps]
    print(f"\n{'sweep':>5} {'kills':>5} {'ended 1st':>9} {'command s':>9} {'added s':>8} {'exit':>4} "
          f"{'violations':>10}")
    for n, (s, extra) in enumerate(zip(sweeps, added), start=1):
        print(f"{n:>5} {sum(not k.ended_first for k in s.kills):>5} {sum(k.ended_first for k in s.kills):>9} "
              f"{s.command_s:>9.1f} {extra:>+8.1f} {s.final_exit!s:>4} {len(s.violations):>10}")
    tried = [k for s in sweeps for k in s.kills]
    landed = [k for k in tried if not k.ended_first]
    print(f"unkilled run: {baseline.final_s:.1f} s; kill instants tried {len(tried)}, landed {len(landed)} "
          f"({', '.join(f'{kind} {sum(k.kind == kind for k in landed)}' for kind in KILL_KINDS)})")
    if landed:
        print(f"a resume adds {sum(added) / len(landed):+.1f} s per kill on average "
              f"(the killed sweeps' command seconds minus the unkilled run's, per sweep: "
              f"{', '.join(f'{a:+.1f}' for a in added)}); every kill also starts a new cluster: "
              f"{sum(k.cluster_s for k in landed) / len(landed):.1f} s each")
    violations = [f"sweep {n}: {v}" for n, s in enumerate(sweeps, start=1) for v in s.violations]
    print(f"violations: {len(violations)}" + "".join(f"\n  {v}" for v in violations))
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "unkilled": baseline.to_json(), "sweeps": [s.to_json() for s in sweeps],
        "added_seconds": [round(a, 1) for a in added], "violations": violations,
        "wall_seconds": round(time.monotonic() - began, 1),
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"written {args.out}")
    if violations or baseline.violations:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
