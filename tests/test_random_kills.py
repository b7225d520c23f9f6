"""A sweep whose whole cluster is SIGKILLed right after a checkpoint's upload to S3, once the first trials
have written their evaluations, ends with every trial exactly once (sweep/testing/random_kills.py, the
harness scripts/random_kills.py runs many times over).

The KubeRay shape on this machine: a head on the driver's disk, a GPU worker node on its own disk, S3 from
moto_server. A kill ends every process of the driver and of Ray at once and wipes the head's disk; S3 is
kept; a new cluster runs the same command (resume=auto). The kill falls right after one of a checkpoint's
requests once the run reported 3 evaluations (most likely a trial has finished by then), at the first such
upload after an instant drawn by a seeded ``random.Random``; the second run finishes. (One kill here, for the
suite's time: tests/test_preemption.py resumes a sweep twice; scripts/random_kills.py draws any number of
kills, at state uploads too.)

Proved: exit 0 without a traceback; one record per seed, each trained to its last step, the best model
exported; one history per trial in S3 (a trial restarted under a new id would add one) holding each epoch
once (none trained again past its checkpoint), and a trial finished at a kill never written again; in the
MLflow store copied to S3, one FINISHED parent with one FINISHED run per seed, each evaluation logged once,
the records' run ids those runs'; one model version registered.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sweep.testing.local_cluster import namespace_refused
from sweep.testing.random_kills import KillRounds

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.ray_cluster, pytest.mark.timeout(1500)]

# the cheapest sweep that still has trials before, at and after each kill: an unkilled run takes about
# 35-40 s of command here (4 trials of 64 rows one after another on the one GPU node), plus 16 s of cluster start
SEEDS = (1, 2, 3, 4)
EPOCHS = 3
ROWS = 64
# Each kill: its kind, and the history files (the trials' evaluations) its run must have written to S3 first:
# 3 (most likely a trial finished: it must never be written again), right after a checkpoint's upload.
KILLS = (("checkpoint-upload", 3),)
# The earliest instant is drawn in [1 s, 10 s] (seed 0: 8.6 s), inside the start-up (imports,
# staging, a resume: about 20 s here): the history writes place the kills, the clock cannot on a busy machine.
DRAWS_SEED = 0
LATEST_DRAW_S = 10.0


@pytest.fixture
def kill_rounds(tmp_path: Path):
    refused = namespace_refused()
    if refused:
        pytest.skip(f"a node with its own disk needs a mount namespace: {refused}")
    rounds = KillRounds(tmp_path, SEEDS, EPOCHS, ROWS)
    try:
        yield rounds.start()
    finally:
        rounds.close()


def test_a_sweep_killed_at_a_checkpoint_upload_ends_every_trial_exactly_once(kill_rounds: KillRounds) -> None:
    draws = random.Random(DRAWS_SEED)
    kills = [kill_rounds.round(kind, draws, LATEST_DRAW_S, after_histories=n) for kind, n in KILLS]
    code = kill_rounds.finish(timeout=600)
    violations = kill_rounds.verify()

    lines = "\n".join(k.line() for k in kills)
    assert not kills[0].ended_first, f"the first kill never came: nothing was proved\n{lines}"
    assert violations == [], (f"exit {code}; the kills:\n{lines}\nviolations:\n" + "\n".join(violations)
                              + f"\nthe final run's output ends:\n{kill_rounds.final_log_tail()}")
    print(lines)
