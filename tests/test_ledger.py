"""The sweep's ledger (sweep/results/ledger.py), Ray-free: entries on a folder and in S3 (a real moto_server), what a
resume runs and keeps, the lease between two drivers; the searchers carrying the ledger's trials; the end's
checkpoint lookups (sweep/trial/kept_checkpoints.py) when storage lost the best one.

The whole sweep killed at random instants: tests/test_random_kills.py (scripts/random_kills.py for more)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sweep.errors import OutDirInUseError
from sweep.results.ledger import LeaseHolder, Ledger, TrialEntry, identity_of, left_to_run, resuming_line
from sweep.results.trial_reports import CHECKPOINT_MARKER, point_of
from sweep.trial.kept_checkpoints import newest_whole, with_marker
from tests.helpers.s3 import s3_env


def test_a_trials_identity_is_the_same_for_the_same_trial_and_apart_for_any_other() -> None:
    one = identity_of("RTE", 1, {"lr": 2e-5}, 0)
    assert one == identity_of("RTE", 1, {"lr": 2e-5}, 0)
    others = {identity_of("RTE", 2, {"lr": 2e-5}, 0), identity_of("RTE", 1, {"lr": 3e-5}, 0),
              identity_of("RTE", 1, {"lr": 2e-5}, 1), identity_of("WNLI", 1, {"lr": 2e-5}, 0)}
    assert one not in others and len(others) == 4
    assert one.startswith("RTE-seed1-") and one.endswith("-r0")


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_entries_are_replaced_whole_and_read_back(where, tmp_path: Path, request, monkeypatch) -> None:
    if where == "s3":
        import boto3

        s3_env(monkeypatch, request.getfixturevalue("moto_server"))
        boto3.client("s3").create_bucket(Bucket="sweep-results")
        root = "s3://sweep-results/ray"
    else:
        root = str(tmp_path / "ray")
    ledger = Ledger(root)
    assert not ledger.begun() and ledger.entries() == {}
    ledger.begin(["RTE-seed1-x-r0", "RTE-seed2-x-r0"])
    assert ledger.begun()
    entry = ledger.put(TrialEntry("RTE-seed1-x-r0", "RTE", 1, state="running", trial_id="abc_00000"))
    ledger.put(TrialEntry("RTE-seed1-x-r0", "RTE", 1, state="checkpointed", trial_id="abc_00000",
                          checkpoint=f"{root}/tune/t/checkpoint_000001", step=12))
    (found,) = ledger.entries().values()
    assert found.state == "checkpointed" and found.step == 12 and found.updated >= entry.updated
    if where == "folder":  # no temporary left beside the entry; its bytes were synced before the rename
        assert sorted(p.name for p in (tmp_path / "ray" / "ledger" / "trials").iterdir()) == ["RTE-seed1-x-r0.json"]
    ledger.begin(["RTE-seed3-x-r0"])  # a new sweep in the same storage: the old entries go
    assert ledger.entries() == {}


def planned(seeds=(1, 2, 3, 4)):
    points = [point_of("RTE", seed, {}) for seed in seeds]
    identities = [identity_of("RTE", seed, {}, 0) for seed in seeds]
    return points, identities, [0] * len(points)


def test_a_resume_keeps_what_ended_continues_what_checkpointed_and_starts_the_rest() -> None:
    points, identities, rounds = planned()
    entries = {
        identities[0]: TrialEntry(identities[0], "RTE", 1, state="finished", trial_id="a_1"),
        identities[1]: TrialEntry(identities[1], "RTE", 2, state="checkpointed", trial_id="a_2",
                                  hparams={"lr": 1e-4}, checkpoint="s3://b/ray/tune/t2/checkpoint_000000", step=5,
                                  folders=["s3://b/ray/tune/t2"]),
        identities[2]: TrialEntry(identities[2], "RTE", 3, state="running", trial_id="a_3"),
    }
    left = left_to_run(points, identities, rounds, entries)
    assert list(left.kept) == [identities[0]]
    assert [p["seed"] for p in left.points] == [2, 3, 4]
    assert left.extras[0] == {"identity": identities[1], "sample_round": 0, "continues": {
        "trial_id": "a_2", "hparams": {"lr": 1e-4}, "checkpoint": "s3://b/ray/tune/t2/checkpoint_000000",
        "folders": ["s3://b/ray/tune/t2"]}}
    assert left.extras[1]["continues"]["trial_id"] == "a_3" and left.extras[1]["continues"]["checkpoint"] is None
    assert left.extras[2] == {"identity": identities[3], "sample_round": 0}
    assert (left.continued, left.restarted, left.running) == (1, 1, 3)
    assert resuming_line("s3://b/ray", left) == (
        "resume: continuing the sweep in s3://b/ray from its ledger: of its 4 trials 1 finished (not run again), "
        "1 go on from their checkpoints, 1 start again (no checkpoint yet), 1 not started yet")


def test_every_trial_ended_leaves_nothing_to_run() -> None:
    points, identities, rounds = planned((1, 2))
    entries = {i: TrialEntry(i, "RTE", s, state=state, trial_id=f"t{s}", error="boom" if state == "failed" else None)
               for i, s, state in zip(identities, (1, 2), ("finished", "failed"))}
    left = left_to_run(points, identities, rounds, entries)
    assert left.running == 0 and len(left.kept) == 2
    assert resuming_line("/r", left).endswith("1 finished (not run again), 0 go on from their checkpoints, "
                                              "1 failed (kept as they are)")


def test_the_searcher_hands_out_each_trial_with_its_ledger_identity_and_an_earlier_draw_as_it_was() -> None:
    from sweep.schedulers.gate import RandomSearch

    points, identities, rounds = planned((1, 2))
    extras = [{"identity": identities[0], "sample_round": 0,
               "continues": {"trial_id": "a_1", "hparams": {"lr": 0.5}, "checkpoint": None, "folders": []}},
              {"identity": identities[1], "sample_round": 0}]
    searcher = RandomSearch(points, set(), {"lr": {"dist": "loguniform", "low": 1e-5, "high": 1e-3}}, seed=7)
    searcher.carry(extras)
    first, second = searcher.suggest("t1"), searcher.suggest("t2")
    assert first["hparams"] == {"lr": 0.5} and first["continues"]["trial_id"] == "a_1"
    assert first["identity"] == identities[0] and second["identity"] == identities[1]
    assert 1e-5 <= second["hparams"]["lr"] <= 1e-3 and "continues" not in second
    with pytest.raises(ValueError):
        searcher.carry(extras[:1])


def test_a_resumed_tpe_study_learns_the_trials_an_earlier_launch_finished() -> None:
    from sweep.schedulers.optuna_search import TaskOptunaSearch

    search = {"lr": {"dist": "loguniform", "low": 1e-5, "high": 1e-3}}
    points = [point_of("RTE", seed, {}) for seed in (1, 2)]
    searcher = TaskOptunaSearch(points, search, 0, set())
    searcher.learn_from([(point_of("RTE", 9, {}), {"lr": 1e-4}, 0.7), (point_of("RTE", 8, {}), {"lr": 2e-4}, None)])
    study = searcher.studies.studies["RTE"]
    assert [(t.params, t.value, t.state.name) for t in study.trials] == [
        ({"lr": 1e-4}, 0.7, "COMPLETE"), ({"lr": 2e-4}, None, "FAIL")]
    continued = searcher.config_known("t1", points[0], {"lr": 3e-4})  # asked again as it was
    assert continued["hparams"] == {"lr": 3e-4}
    searcher.on_trial_complete("t1", {"score": 0.8})
    assert [t.value for t in study.trials][-1] == 0.8


def test_a_second_driver_is_refused_while_the_first_renews_its_lease(tmp_path: Path, monkeypatch) -> None:
    ledger = Ledger(str(tmp_path / "ray"))
    first = ledger.take_lease()
    beating = threading.Event()

    def renew():  # the first driver alive: its heartbeat moves
        while not beating.wait(0.2):
            first.beat()

    threading.Thread(target=renew, daemon=True).start()
    # it runs in this very process (alive): the second driver watches the heartbeat move, and is refused
    with pytest.raises(OutDirInUseError, match=r"another driver is running this sweep \(pid \d+ on .*stop it first"):
        ledger.take_lease(wait_s=5, poll_s=0.3, say=lambda line: None)
    beating.set()
    first.release()
    assert ledger.holder() is None


def test_a_dead_drivers_lease_is_taken_over_at_once_on_its_host_and_after_its_ttl_elsewhere(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ray"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    import socket

    now = time.time()
    ledger.files.write("lease", LeaseHolder("old", socket.gethostname(), dead_pid, now, now).__dict__)
    began = time.monotonic()
    lease = ledger.take_lease(wait_s=30, say=lambda line: None)
    assert time.monotonic() - began < 2 and ledger.holder().owner == lease.owner and ledger.holder().pid == os.getpid()
    # another host's driver whose heartbeat stopped: taken once it has not moved for the wait
    ledger.files.write("lease", LeaseHolder("other", "another-host", 1, now, now).__dict__)
    said = []
    began = time.monotonic()
    lease = ledger.take_lease(wait_s=1.5, poll_s=0.3, say=said.append)
    assert 1.4 < time.monotonic() - began < 5 and ledger.holder().owner == lease.owner
    assert said and "held by the driver pid 1 on another-host" in said[0]


def checkpoint(trial_dir: Path, index: int, checkpoint_id: str, step: int) -> Path:
    folder = trial_dir / f"checkpoint_{index:06d}"
    folder.mkdir(parents=True)
    (folder / CHECKPOINT_MARKER).write_text(json.dumps({"step": step, "checkpoint_id": checkpoint_id}))
    return folder


def test_the_best_checkpoint_is_found_in_any_launchs_folder_and_when_gone_the_newest_whole_one(tmp_path: Path):
    first, second = tmp_path / "tune" / "first", tmp_path / "tune" / "second"
    best = checkpoint(first, 0, "id-best", 10)
    checkpoint(second, 0, "id-later", 20)
    checkpoint(second, 1, "id-torn", 30)  # its evaluation never reached the history: not whole
    folders = [str(first), str(second)]
    assert with_marker(folders, "id-best", 10) == str(best)
    assert newest_whole(folders, {"id-best", "id-later"}) == (str(second / "checkpoint_000000"), "id-later")
    import shutil

    shutil.rmtree(best)  # what a kill between Tune's deletion and its snapshot leaves
    assert with_marker(folders, "id-best", 10) is None
    assert newest_whole(folders, {"id-best", "id-later"})[1] == "id-later"
    assert newest_whole([str(tmp_path / "nothing")], {"id-best"}) is None


def test_the_ledgers_callback_writes_each_change_of_a_trials_state(tmp_path: Path) -> None:
    """Tune's callbacks called by hand, as Tune calls them on the driver; the entries read back from the folder."""
    from types import SimpleNamespace

    import pyarrow.fs

    from sweep.hooks.ledger_entries import KeepTheLedger

    ledger = Ledger(str(tmp_path / "ray"))
    hook = KeepTheLedger(ledger)
    identity = identity_of("RTE", 1, {}, 0)
    local = pyarrow.fs.LocalFileSystem()
    folder = str(tmp_path / "ray" / "tune" / "trial_a")
    trial = SimpleNamespace(
        trial_id="new_00000", last_result={},
        config={"trial": point_of("RTE", 1, {}), "hparams": {"lr": 1e-4}, "identity": identity, "sample_round": 0,
                "continues": {"trial_id": "old_00003", "hparams": {"lr": 1e-4}, "checkpoint": None, "folders": []}},
        storage=SimpleNamespace(storage_filesystem=local, trial_fs_path=folder))
    hook.on_trial_start(0, [], trial)
    entry = ledger.entry(identity)
    assert (entry.state, entry.trial_id, entry.hparams, entry.folders, entry.attempts) == (
        "running", "old_00003", {"lr": 1e-4}, [folder], 1)  # it goes on under the earlier launch's id
    trial.last_result = {"trial_id": "old_00003", "step": 12, "score": 0.6}
    hook.on_checkpoint(0, [], trial, SimpleNamespace(filesystem=local, path=f"{folder}/checkpoint_000001"))
    entry = ledger.entry(identity)
    assert (entry.state, entry.checkpoint, entry.step) == ("checkpointed", f"{folder}/checkpoint_000001", 12)
    hook.on_trial_complete(0, [], trial)
    assert ledger.entry(identity).state == "finished"

    other = SimpleNamespace(trial_id="new_00001", config={"trial": point_of("RTE", 2, {}), "hparams": {},
                                                          "identity": identity_of("RTE", 2, {}, 0)},
                            last_result={"trial_id": "new_00001", "trial_error": "RTE: no label column"},
                            storage=None)
    hook.on_trial_start(0, [], other)
    hook.on_trial_complete(0, [], other)  # ended on its own data: failed, with its line, never run again
    failed = ledger.entry(identity_of("RTE", 2, {}, 0))
    assert (failed.state, failed.error, failed.trial_id) == ("failed", "RTE: no label column", "new_00001")
    gone = SimpleNamespace(trial_id="new_00002", config={"trial": point_of("RTE", 3, {}), "hparams": {},
                                                         "identity": identity_of("RTE", 3, {}, 0)},
                           last_result={}, storage=None, get_error=lambda: RuntimeError("the node died"))
    hook.on_trial_error(0, [], gone)
    assert (ledger.entry(identity_of("RTE", 3, {}, 0)).state, ledger.entry(identity_of("RTE", 3, {}, 0)).error) == (
        "failed", "the node died")


def test_the_records_of_trials_an_earlier_launch_ended_come_from_the_ledger_and_their_histories(tmp_path: Path):
    """One record per ended entry: its best evaluation from its history, its checkpoint in the folder it ran in
    (or, that one gone from storage, its newest whole one, said in ``checkpoint_note``), a failed one ERROR."""
    import shutil

    from sweep.config.validate import compose_settings
    from sweep.driver.tune_results import records_from_ledger
    from sweep.results.trial_reports import Report, TrialHistories

    settings = compose_settings("experiment=demo", "train.epochs=2")
    histories = TrialHistories(str(tmp_path / "history"))
    folder = tmp_path / "tune" / "train_driver_fn_a_00000"
    rows = [Report("a_00000", task="WNLI", seed=38, epoch=e, step=10 * e, steps_total=20, score=s,
                   checkpoint_rank=s, checkpoint_id=f"id-{e}", metrics={"acc": s}, reported_at=100.0 + e,
                   driver_started=100.0) for e, s in ((1, 0.7), (2, 0.6))]
    histories.write("a_00000", [*rows[:-1], rows[-1].ended()])
    best = checkpoint(folder, 0, "id-1", 10)
    checkpoint(folder, 1, "id-2", 20)
    histories.write("b_00001", [Report("b_00001", task="WNLI", seed=39, trial_error="WNLI: bad rows",
                                       trial_done=True)])
    entries = [TrialEntry("WNLI-seed38-x-r0", "WNLI", 38, state="finished", trial_id="a_00000", folders=[str(folder)]),
               TrialEntry("WNLI-seed39-x-r0", "WNLI", 39, state="failed", trial_id="b_00001", error="WNLI: bad rows")]
    ok, failed = records_from_ledger(entries, settings, {}, histories)
    assert (ok.status, ok.score, ok.best_step, ok.steps_done, ok.checkpoint, ok.checkpoint_note) == (
        "TERMINATED", 0.7, 10, 20, str(best), "")
    assert ok.trial_id == folder.name
    assert (failed.status, failed.error, failed.score) == ("ERROR", "WNLI: bad rows", None)

    shutil.rmtree(best)  # storage lost the best checkpoint: the newest whole one, and the line says so
    (again, _) = records_from_ledger(entries, settings, {}, histories)
    assert again.checkpoint == str(folder / "checkpoint_000001") and again.score == 0.7
    assert again.checkpoint_note == ("its best checkpoint (step 10) is gone from storage; its newest whole one "
                                     "(step 20, score 0.6000) is exported instead")


def test_an_end_whose_best_checkpoint_storage_lost_says_so_in_one_line(tmp_path: Path, capsys) -> None:
    from sweep.config.validate import compose_settings
    from sweep.outputs.export import ExportBest, model_writer
    from sweep.results.records import TrialRecord

    settings = compose_settings("experiment=demo")
    record = TrialRecord(task="WNLI", seed=38, score=0.7, checkpoint=str(tmp_path / "gone" / "checkpoint_000001"))
    export = ExportBest(settings.tasks, settings.model.name, model_writer("full", settings.tasks, Path), False)
    assert export.export_one(record, tmp_path / "out") is None
    line = capsys.readouterr().out.strip()
    assert line.startswith("best WNLI: not exported: the best trial's checkpoint (seed 38) is not in storage (")
    assert "\n" not in line and not (tmp_path / "out" / "best" / "WNLI").exists()


def test_a_continued_trials_results_are_read_under_the_id_it_reports_with_not_the_one_tune_writes() -> None:
    """Tune writes its own trial id into every result (its auto-filled metrics), over the trial's: a resumed
    launch's trial is found under the earlier launch's id its config carries (its history, its MLflow run)."""
    from types import SimpleNamespace

    from sweep.driver.tune_results import reported_ids

    continued = SimpleNamespace(metrics={"trial_id": "new_00001"}, path="/s/tune/train_driver_fn_new_1",
                                config={"trial": point_of("RTE", 2, {}), "continues": {"trial_id": "old_00003"}})
    fresh = SimpleNamespace(metrics={"trial_id": "new_00002"}, path="/s/tune/train_driver_fn_new_2",
                            config={"trial": point_of("RTE", 3, {})})
    silent = SimpleNamespace(metrics={}, path="/s/tune/train_driver_fn_new_3", config={})
    assert reported_ids([continued, fresh, silent]) == {"train_driver_fn_new_1": "old_00003",
                                                         "train_driver_fn_new_2": "new_00002"}


def test_a_trials_folder_is_named_by_its_point_and_values_not_the_ledgers_keys() -> None:
    from sweep.driver.tuner import trial_folder_name

    class Trial:
        experiment_tag = "3_checkpoint=s3_b_ray_tune_x,identity=RTE-seed1-abc-r0,seed=1,task=RTE"
        config = {"trial": point_of("RTE", 1, {"lr": 1e-4}), "hparams": {"warmup": 0.1}, "identity": "RTE-seed1-abc-r0",
                  "continues": {"trial_id": "old_1", "checkpoint": "s3://b/ray/tune/x/checkpoint_000001"}}

        def __str__(self) -> str:
            return "train_driver_fn_5f3a9c21"

    name = trial_folder_name(Trial())
    assert name.startswith("train_driver_fn_5f3a9c21_3_lr=0.0001,seed=1,task=RTE,warmup=0.1000_"), name
    assert "identity" not in name and "s3" not in name and "/" not in name


def test_a_sweeps_end_is_done_only_for_the_trials_it_covered(tmp_path: Path) -> None:
    from sweep.app import planned_identities
    from tests.helpers.configs import demo_settings

    settings = demo_settings("sweep.num_samples=2")  # WNLI, seeds 38-40
    planned = planned_identities(settings)
    assert len(set(planned)) == 6 and identity_of("WNLI", 39, {}, 1) in planned
    ledger = Ledger(str(tmp_path / "ray"))
    ledger.begin(planned)
    assert not ledger.ended_with(planned) and ledger.ended_at() is None
    ledger.end()
    assert ledger.ended_with(planned) and ledger.ended_with(planned[:2])
    more = planned_identities(demo_settings("sweep.num_samples=3"))
    assert not ledger.ended_with(more)  # the command plans trials this sweep never ran: not done
    ledger.extend(more)
    assert ledger.ended_at() is None and not ledger.ended_with(planned)
