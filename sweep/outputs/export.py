"""The best trial per task, and its model exported into out_dir/best/<task>: a copy of its checkpoint (full
fine-tuning), or its LoRA adapter merged into the base model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sweep.config.tasks import TaskSpec
from sweep.failures import error_line
from sweep.outputs.steps import Outcome, Step
from sweep.results.records import TrialRecord, best_per_task, copy_model, export_best


class PickBest(Step):
    """Each task's best trial; with seeds_per_point > 1 the best config (its seeds' aggregate) gives the
    best model, not the luckiest seed. Every record says what it was trained on (the sources' commits)."""

    name = "best"

    def __init__(self, tasks: Sequence[TaskSpec], aggregate: str | None, provenance: Mapping[str, str]) -> None:
        self.tasks, self.aggregate, self.provenance = list(tasks), aggregate, dict(provenance)

    def run(self, outcome: Outcome) -> None:
        for record in outcome.records:
            record.sources = self.provenance
        outcome.best = best_per_task(outcome.records, self.tasks, self.aggregate)


WriteModel = Callable[[Path, Path], None]


class ExportBest(Step):
    """Each task's best model into out_dir/best/<task>. A checkpoint storage lost is one line and the task's
    model is left out (a resume trains it again), never a traceback after the trials' work."""

    name = "export"

    def __init__(self, tasks: Sequence[TaskSpec], model_name: str, writer: Callable[[str], WriteModel],
                 forget_checkpoints: bool) -> None:
        self.metric = {spec.name: spec.metric for spec in tasks}
        self.model_name, self.writer = model_name, writer
        self.forget_checkpoints = forget_checkpoints  # keep_checkpoints=best: pruned once the end is done

    def run(self, outcome: Outcome) -> None:
        for task, record in list(outcome.best.items()):
            if self.export_one(record, outcome.out_dir) is None:  # the other tasks' models are still kept
                del outcome.best[task]
                outcome.complete = False
        if self.forget_checkpoints and outcome.checkpoint_folders:
            for record in outcome.records:
                record.checkpoint = None

    def export_one(self, record: TrialRecord, out_dir: Path) -> Path | None:
        task = record.task
        if record.checkpoint_note:
            print(f"best {task}: seed {record.seed}: {record.checkpoint_note}")
        try:
            exported = export_best(record, out_dir / "best" / task, self.model_name, self.writer(task))
        except FileNotFoundError as e:  # pyarrow's for a folder gone from S3 too
            print(f"best {task}: not exported: the best trial's checkpoint (seed {record.seed}) is not in storage "
                  f"({error_line(e)}); its scores are in results.csv. Run the sweep again to train it")
            return None
        print(f"best {task}: seed {record.seed}, {self.metric[task]} {record.score:.4f} -> {exported}")
        return exported


def model_writer(method: str, tasks: Sequence[TaskSpec], base_model: Callable[[], Path]) -> Callable[[str], WriteModel]:
    """How a task's best checkpoint becomes an export: copied (full fine-tuning), or its LoRA adapter merged
    into the base model (``base_model``: the base's folder on this machine, found only when needed)."""
    if method == "full":
        return lambda task: copy_model
    from sweep.train.lora import export_merged

    specs = {spec.name: spec for spec in tasks}
    return lambda task: (lambda checkpoint, target: export_merged(checkpoint, base_model(), specs[task], target))
