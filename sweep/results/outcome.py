"""How a sweep ended, told truthfully: each failed trial's one-line reason (the same reason once, with its
seeds) and the exit code: a task whose every trial failed fails the command.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.results.records import TaskSummary, TrialRecord

EXIT_TASK_FAILED = 3  # every trial of a task failed (1: the sweep itself failed; 2: a mistake in the input)


def failure_lines(records: Sequence[TrialRecord]) -> list[str]:
    """'failed: RTE seeds 38, 39: <reason>' per task and reason, in the order the trials ran."""
    seeds: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in records:
        if not r.ok:
            seeds[(r.task, r.error or "no result reported")].append(r.seed)
    lines = []
    for (task, reason), of in seeds.items():
        which = f"seed {of[0]}" if len(of) == 1 else f"{len(of)} trials (seeds {', '.join(map(str, sorted(set(of))))})"
        lines.append(f"failed: {task} {which}: {reason}")
    return lines


def failed_tasks(summaries: Sequence[TaskSummary]) -> list[str]:
    """The tasks none of whose trials finished."""
    return [s.task for s in summaries if s.n == 0 and s.failed > 0]


def exit_code(summaries: Sequence[TaskSummary]) -> int:
    return EXIT_TASK_FAILED if failed_tasks(summaries) else 0


def verdict_line(summaries: Sequence[TaskSummary]) -> str | None:
    """The last line of a sweep with a task that produced nothing (None when every task has a result)."""
    tasks = failed_tasks(summaries)
    if not tasks:
        return None
    return (f"error: every trial of {', '.join(tasks)} failed (the reasons above); exit code {EXIT_TASK_FAILED}"
            + ("; the other tasks' results and models are kept" if len(tasks) < len(summaries) else ""))


@dataclass(frozen=True)
class SavedTrial:
    """A trial as a resumed sweep finds it in Tune's saved experiment."""

    finished: bool  # its last report was its last: not run again
    failed: bool  # ended in an error: not run again (resume_errored=False)
    checkpointed: bool  # has a checkpoint to go on from


def resuming_line(experiment: str, trials: list[SavedTrial]) -> str:
    """The one line a resumed sweep starts with: what it found and what each trial will do."""
    finished = sum(t.finished and not t.failed for t in trials)
    failed = sum(t.failed for t in trials)
    rest = [t for t in trials if not t.finished and not t.failed]
    from_checkpoint = sum(t.checkpointed for t in rest)
    parts = [f"{finished} finished (not run again)", f"{from_checkpoint} restart from their checkpoints"]
    if len(rest) > from_checkpoint:
        parts.append(f"{len(rest) - from_checkpoint} start from the beginning (no checkpoint yet)")
    if failed:
        parts.append(f"{failed} failed (kept as they are)")
    return f"resume: continuing the sweep in {experiment}: of its {len(trials)} saved trials " + ", ".join(parts)
