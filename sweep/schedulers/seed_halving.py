"""Tune's side of seed halving: pause a trial at the rung until its task is decided.

Seed halving decides once, when every trial of a task has reached the rung (``schedulers.SeedHalving``
on the rungs board). A trial that gets there first waits; if it kept its CPU/GPU while waiting,
the seeds not yet started could never run where trials outnumber slots. Tune can pause it: it keeps
the trial's last checkpoint (the rung evaluation's), frees the resources and resumes it later
from there. Multi-GPU (DDP) trials are refused with seed halving (tuner): pausing their function
would leave the Train worker group running.
"""

from __future__ import annotations

from ray.tune.schedulers import FIFOScheduler

from sweep.plan.rung_boards import ASHA_NAMESPACE, EvalPoint
from sweep.plan.rungs import past_rung
from sweep.results.trial_reports import Report, sweep_trial_id, trial_of


class SeedHalvingScheduler(FIFOScheduler):
    """Tune's side of seed halving: pauses a trial that reached the rung before its task is decided
    (Tune keeps its checkpoint of that evaluation and frees its resources), starts every pending
    trial before a paused one, and resumes the paused trials once their task is decided (a stopped
    one ends at once on resume, having asked the board)."""

    _supports_buffered_results = False  # a result must be seen before the trial trains on

    def __init__(self, board: str, at: float):
        super().__init__()
        self.board_name, self.at = board, at
        self.decided: set[str] = set()
        self.ended: set[str] = set()  # trials the board has been told of (ended before the rung or not)
        self._board = None

    def __getstate__(self):  # Tune pickles its scheduler with the experiment state: no actor handle
        # nor what the board was told: a resumed sweep's new board hears again of the trials that ended
        return {**self.__dict__, "_board": None, "ended": set()}

    @property
    def board(self):
        if self._board is None:
            import ray

            self._board = ray.get_actor(self.board_name, namespace=ASHA_NAMESPACE)
        return self._board

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        import ray

        task = trial_of(trial.config)[0]
        # Tune writes its own id into every result: the board knows the trial by the id it reports with
        point = EvalPoint.from_report(Report.from_row({**result, "trial_id": _id(trial)}))
        if point is None or not past_rung(point.progress, self.at) or task in self.decided:
            return self.CONTINUE
        verdict = ray.get(self.board.at_eval.remote(point))
        if verdict is None:
            return self.PAUSE  # saves the checkpoint it just reported, frees its resources
        self.decided.add(task)
        return self.CONTINUE

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        self._gone(trial)

    def on_trial_error(self, tune_controller, trial) -> None:
        self._gone(trial)

    def _gone(self, trial) -> None:
        import ray

        self.ended.add(trial.trial_id)
        task = trial_of(trial.config)[0]
        if task not in self.decided and ray.get(self.board.gone.remote(task, _id(trial))):
            self.decided.add(task)

    def choose_trial_to_run(self, tune_controller):
        from ray.tune.experiment import Trial

        trials = tune_controller.get_trials()
        # Tune ends some trials without telling its scheduler: one whose reused actor could not be reset
        # (its last trial's thread still saving, on a busy CPU) is set to ERROR and stopped, and
        # on_trial_error never comes. Its task would wait at the rung for it forever, the others paused.
        for trial in trials:
            if trial.status in (Trial.ERROR, Trial.TERMINATED) and trial.trial_id not in self.ended:
                self._gone(trial)
        for trial in trials:  # every seed starts before a paused one goes on
            if trial.status == Trial.PENDING:
                return trial
        for trial in trials:
            if trial.status == Trial.PAUSED and trial_of(trial.config)[0] in self.decided:
                return trial
        return None

    def debug_string(self) -> str:
        return f"Seed halving at {self.at:.0%} of training."


def _id(trial) -> str:
    """The id the trial reports with (an earlier launch's, for a trial a resumed launch goes on with)."""
    return sweep_trial_id(trial.trial_id, trial.config)
