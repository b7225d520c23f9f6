"""sweep.scheduler=pbt: Tune's ``PopulationBasedTraining``, one population per task (and grid point).

Tune's PBT ranks every trial it is given against every other; scores of different tasks must never
meet (as the rungs of ASHA and seed halving guarantee), and a trial can only clone a checkpoint of its
own shape (a grid point). ``TaskPbt`` holds one PBT per population and hands each its own trials only,
and a view of the controller that shows it only those (PBT asks the controller for "all trials" to
pick the next to run and to decide whether to pause for a pending one).

An exploit pauses the trial and restarts it from the donor's latest checkpoint with mutated
``hparams``: the trial's own resume path (``trial/train_fn.py``), which reads from the checkpoint's marker
whose trial wrote it and records the donor in the trial's history.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ray.train.constants import CHECKPOINT_DIR_NAME
from ray.tune.schedulers import FIFOScheduler, PopulationBasedTraining

from sweep.config.settings import PbtConfig
from sweep.results.trial_reports import EVAL_PREFIX, OWN_KEYS

METRIC, MODE = "score", "max"  # the task's selection score, higher is better (trials.Report)
PERTURBATION_FACTORS = (1.2, 0.8)  # Tune's default, named so that KeepInRange bounces with the same ones
TIE_BREAK = 1e-6  # x eval loss, subtracted from the score PBT ranks by


class KeepInRange:
    """PBT perturbs a continuous value by x0.8 / x1.2, which can leave its range (a warmup ratio past 1).
    A value pushed past a bound takes the other factor instead (a donor's lr at the lower bound goes
    x1.2, not x0.8), so an exploit always moves what it perturbs; the result is clamped to [low, high].
    A class, not a closure: Tune pickles its scheduler."""

    def __init__(self, mutations: dict[str, dict[str, Any]], factors: tuple[float, float] = PERTURBATION_FACTORS):
        self.bounds = {k: (s["low"], s["high"]) for k, s in mutations.items() if s["dist"] != "choice"}
        self.up, self.down = max(factors), min(factors)

    def __call__(self, donor: dict[str, Any], mutated: dict[str, Any]) -> dict[str, Any]:
        """``mutated`` (the donor's ``hparams`` after Tune's explore) with each bounded key in range."""
        kept = dict(mutated)
        for key, (low, high) in self.bounds.items():
            if key not in kept:
                continue
            value = float(kept[key])
            if key in donor and not low <= value <= high:
                value = float(donor[key]) * (self.up if value < low else self.down)
            kept[key] = min(max(value, low), high)
        return kept


class TaskPopulation(PopulationBasedTraining):
    """Tune's PBT with these changes for fine-tuning runs:

    * an exploit clones the donor's ``hparams`` only: Tune copies the donor's whole config, which here
      also names the trial's seed and grid point (``trial``) and its ledger identity: the trial keeps its own
      (``trials.OWN_KEYS``);
    * a trial's last evaluation is no perturbation point: its training is over, there is nothing left
      to go on with (Tune would restart it from a donor's checkpoint after it ended);
    * equal scores (accuracy moves in steps of 1/n; early evaluations often tie at the majority class)
      are ranked by the lower eval loss, so a tie does not clone an arbitrary trial;
    * the checkpoint a running trial reported with the result that has it exploited stays its own:
      Tune stops it without registering that checkpoint, so its checkpoint count falls one behind and
      the next stretch's first checkpoint overwrote it (the trial's history still names it);
    * a perturbed value stays in its range and still moves (``KeepInRange``);
    * a bottom trial clones any top one: Tune keeps a checkpoint to clone only of a trial that was top
      when it last reported, and skips the exploit otherwise (a population of 4 could end a sweep
      without one). A trial of ours checkpoints at every evaluation, and its latest is what Tune's save
      would give;
    * a diverged trial (non-finite eval loss) ranks below every other.
    """

    def __init__(self, *args, keep_in_range: KeepInRange, **kwargs):
        super().__init__(*args, **kwargs)
        self.keep_in_range = keep_in_range

    def _exploit(self, tune_controller, trial, trial_to_clone):
        if trial.status == trial.RUNNING:
            keep_reported_checkpoint(trial, self._trial_state[trial].last_result)
        super()._exploit(tune_controller, trial, trial_to_clone)

    def _checkpoint_or_exploit(self, trial, tune_controller, upper_quantile, lower_quantile):
        if trial in lower_quantile:
            for donor in upper_quantile:
                state = self._trial_state[donor]
                if state.last_checkpoint is None:
                    state.last_checkpoint = donor.checkpoint  # its latest: the evaluation it ranks by
        super()._checkpoint_or_exploit(trial, tune_controller, upper_quantile, lower_quantile)

    def _get_new_config(self, trial, trial_to_clone):
        new_config, operations = super()._get_new_config(trial, trial_to_clone)
        hparams = self.keep_in_range(trial_to_clone.config.get("hparams") or {}, new_config.get("hparams") or {})
        donors = {k: v for k, v in new_config.items() if k not in OWN_KEYS}  # the donor's identity stays its own
        return {**donors, "hparams": hparams, **{k: trial.config[k] for k in OWN_KEYS if k in trial.config}}, operations

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if (result.get("progress") or 0.0) >= 1.0:
            return self.CONTINUE
        return super().on_trial_result(tune_controller, trial, result)

    def _save_trial_state(self, state, time, result: dict, trial):
        score = super()._save_trial_state(state, time, result, trial)
        loss = result.get(f"{EVAL_PREFIX}eval_loss")
        if isinstance(loss, (int, float)) and score is not None and not math.isnan(score):
            # far below a score's own resolution; a diverged trial (NaN or infinite loss) ranks last
            state.last_score = score - TIE_BREAK * loss if math.isfinite(loss) else -math.inf
        return state.last_score


def keep_reported_checkpoint(trial, result: dict | None) -> None:
    """Register the checkpoint ``result`` came with as ``trial``'s: it keeps its folder (Tune names each
    checkpoint by the trial's count of registered ones) and is among the trial's checkpoints Tune hands
    back, where the records look for the best evaluation's on remote storage."""
    from ray.train import Checkpoint

    from sweep.cluster.ray_internals import training_result

    name = (result or {}).get(CHECKPOINT_DIR_NAME)
    if not name or trial.storage.checkpoint_dir_name == name:  # none, or registered already
        return
    path = f"{trial.storage.trial_fs_path}/{name}"
    trial.on_checkpoint(training_result(Checkpoint(path, trial.storage.storage_filesystem), dict(result)))


def make_pbt(pbt: PbtConfig) -> PopulationBasedTraining:
    """One task's PBT: every ``interval`` evaluations (Tune's training iterations) the bottom
    ``quantile`` clones the top one's checkpoint and mutates ``hparams``."""
    from sweep.schedulers.search_space import search_domain

    return TaskPopulation(
        time_attr="training_iteration", metric=METRIC, mode=MODE,
        perturbation_interval=pbt.interval,
        hyperparam_mutations={"hparams": {k: search_domain(s, choice_as_list=True) for k, s in pbt.mutations.items()}},
        quantile_fraction=pbt.quantile, resample_probability=pbt.resample_probability,
        keep_in_range=KeepInRange(pbt.mutations, PERTURBATION_FACTORS),
        perturbation_factors=PERTURBATION_FACTORS,
        # a report that is no evaluation (a trial's error row) has no score: not a perturbation point
        require_attrs=False,
        log_config=False,  # the trial's history says its schedule (results.json), on any storage
    )


def population_of(config: dict[str, Any]) -> str:
    """A trial's population: its task and grid point. A grid key (batch size, epochs, LoRA rank) fixes
    the run's shape, so a trial can only go on from a checkpoint of its own grid point."""
    point = config["trial"]
    return json.dumps([point["task"], point.get("grid") or {}], sort_keys=True)


class _TaskView:
    """The controller as one population's PBT should see it: only that population's trials."""

    # Tune's PBT refuses any search algorithm (it would fight the exploits over the configs); the
    # sweep's only hands out its trial points in order and draws the first population (schedulers/gate.py)
    search_alg = None

    def __init__(self, controller, population: str):
        self._controller, self._population = controller, population

    def get_trials(self):
        return [t for t in self._controller.get_trials() if population_of(t.config) == self._population]

    def get_live_trials(self):
        return [t for t in self._controller.get_live_trials() if population_of(t.config) == self._population]

    def __getattr__(self, name: str):  # pause_trial, _schedule_trial_save, ...
        return getattr(self._controller, name)


class TaskPbt(FIFOScheduler):
    """A PBT per population (``make_pbt``): each task's trials, per grid point, alone."""

    _supports_buffered_results = False  # PBT must see each evaluation before the trial trains on

    def __init__(self, pbt: PbtConfig):
        super().__init__()
        self.config = pbt
        self.by_population: dict[str, PopulationBasedTraining] = {}  # population_of -> its PBT

    def _of(self, trial) -> tuple[PopulationBasedTraining, str]:
        population = population_of(trial.config)
        if population not in self.by_population:
            self.by_population[population] = make_pbt(self.config)
        return self.by_population[population], population

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True  # each PBT has its own metric and mode (METRIC, MODE)

    def on_trial_add(self, tune_controller, trial) -> None:
        pbt, task = self._of(trial)
        pbt.on_trial_add(_TaskView(tune_controller, task), trial)

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        pbt, task = self._of(trial)
        return pbt.on_trial_result(_TaskView(tune_controller, task), trial, result)

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        pbt, task = self._of(trial)
        pbt.on_trial_complete(_TaskView(tune_controller, task), trial, result)

    def on_trial_error(self, tune_controller, trial) -> None:
        pbt, task = self._of(trial)
        pbt.on_trial_error(_TaskView(tune_controller, task), trial)

    def on_trial_remove(self, tune_controller, trial) -> None:
        pbt, task = self._of(trial)
        pbt.on_trial_remove(_TaskView(tune_controller, task), trial)

    def choose_trial_to_run(self, tune_controller):
        """Each population's PBT offers its least-trained waiting trial; of those, the least trained
        runs (taking the populations in order would leave a later one's paused trials waiting until
        the first is nearly done: Tune resumes a paused trial only through this choice)."""
        offers = []
        for population, pbt in self.by_population.items():
            trial = pbt.choose_trial_to_run(_TaskView(tune_controller, population))
            if trial is not None:
                offers.append((pbt._trial_state[trial].last_train_time, len(offers), trial))
        return min(offers)[2] if offers else None

    def debug_string(self) -> str:
        return "; ".join(f"{task}: {pbt.debug_string()}" for task, pbt in self.by_population.items())
