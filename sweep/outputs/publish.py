"""Where a sweep's end goes beyond out_dir: MLflow (the tracking session), storage.output_prefix, and the
sweep's ledger (its end marked done, then the checkpoints pruned)."""

from __future__ import annotations

from pathlib import Path

from sweep.outputs.steps import Outcome, Step
from sweep.results.outcome import failed_tasks

RESULT_FILES = ("results.json", "results.csv", "summary.csv", "seed_scores.png", "expected_max.csv", "expected_max.png",
                "importance.csv", "glue_submission.zip")


class RecordInTracking(Step):
    """The end of the sweep in MLflow (what waits in the spool, the registry, the parent's results), then how
    to look at its runs. The session never raises here: a store that fails is its line, and the end is left
    incomplete for a resume to record."""

    name = "tracking"

    def __init__(self, session) -> None:
        self.session = session  # sweep.tracking.session's TrackingSession (or NoTracking)

    def wanted(self, outcome: Outcome) -> bool:
        return self.session.enabled

    def run(self, outcome: Outcome) -> None:
        recorded = self.session.end(outcome.records, outcome.summaries, outcome.best, outcome.plot,
                                    failed=bool(failed_tasks(outcome.summaries)), soups=outcome.soups)
        outcome.complete = recorded and outcome.complete
        line = self.session.look_line()  # runs: sweep ui out_dir=... (or the URL)
        if line:
            print(line)


class UploadOutputs(Step):
    """storage.output_prefix: each task's best model (and soup) and the result files, for a serving runtime; and the
    tracking session's store under <prefix>/mlflow/ (its failure is one line, never the sweep's)."""

    name = "upload"

    def __init__(self, output_prefix: str | None, endpoint: str | None, region: str | None, session) -> None:
        self.prefix = (output_prefix or "").rstrip("/")
        self.endpoint, self.region, self.session = endpoint, region, session

    def wanted(self, outcome: Outcome) -> bool:
        return bool(self.prefix)

    def run(self, outcome: Outcome) -> None:
        try:
            self._upload(outcome.out_dir)
        finally:  # the records too when the results could not go: the head's disk goes with the cluster
            self.session.upload(self.prefix)

    def _upload(self, out_dir: Path) -> None:
        from sweep.storage.s3 import make_client, upload_tree

        client = make_client(self.endpoint, self.region)
        keys = upload_tree(client, out_dir / "best", f"{self.prefix}/best")
        if (out_dir / "soup").is_dir():  # sweep.soup: each task's soup beside its best seed
            keys += upload_tree(client, out_dir / "soup", f"{self.prefix}/soup")
        results = [out_dir / name for name in RESULT_FILES if (out_dir / name).is_file()]
        keys += upload_tree(client, out_dir, self.prefix, files=results)
        exported = (out_dir / "best").iterdir() if (out_dir / "best").is_dir() else ()  # none: a line said why
        for task in sorted(p.name for p in exported if p.is_dir()):
            print(f"uploaded: best {task} -> {self.prefix}/best/{task}/")
        print(f"uploaded: {len(keys)} files to {self.prefix}/")


class MarkEnded(Step):
    """A complete end (every best model exported, uploaded, registered and recorded) is marked done in the
    sweep's ledger, and only then, with keep_checkpoints=best, every trial's checkpoints go: a driver killed
    before this resumes and does the end again from them; a resume after it runs nothing."""

    name = "ledger"

    def __init__(self, ledger, prune: bool) -> None:
        self.ledger, self.prune = ledger, prune  # sweep.results.ledger.Ledger

    def wanted(self, outcome: Outcome) -> bool:
        return outcome.complete

    def run(self, outcome: Outcome) -> None:
        self.ledger.end()
        if self.prune:
            from sweep.remote_files import remove_folder

            for folder in outcome.checkpoint_folders:
                remove_folder(folder)
