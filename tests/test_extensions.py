"""``sweep.run``'s extension points, Ray-free: the one value that carries them (sweep/driver/extensions.py), its
checks (what ``sweep.run`` raises before Ray starts), the user's policy in place of the config's, and what
travels to a trial. The real sweep: tests/test_extensions_sweep.py."""

from __future__ import annotations

import dataclasses
import inspect

import cloudpickle
import pytest
from ray import tune

import sweep
from sweep.driver.extensions import Extensions
from sweep.errors import ConfigError
from sweep.schedulers.policies import AshaPolicy, policies_for


class Mine(sweep.SchedulerPolicy):
    pauses_trials = True


def half(predictions, labels) -> float:
    return 0.5


@pytest.fixture(scope="module")
def settings():
    return sweep.load_settings("experiment=demo", "task.WNLI.metric=half", metrics={"half": half})


def test_the_defaults_are_todays_sweep(settings):
    params = inspect.signature(sweep.run).parameters
    assert [(p, params[p].kind.name, params[p].default) for p in ("scheduler", "callbacks", "metrics")] == [
        ("scheduler", "KEYWORD_ONLY", None), ("callbacks", "KEYWORD_ONLY", ()), ("metrics", "KEYWORD_ONLY", None)]
    assert Extensions.of() == Extensions() and (Extensions().scheduler, Extensions().callbacks) == (None, ())
    plain = sweep.load_settings("experiment=demo", "sweep.scheduler=asha")
    assert type(policies_for(plain.sweep).scheduler) is AshaPolicy
    Extensions().check(plain)


def test_the_users_policy_replaces_the_configs(settings):
    own = Mine(settings.sweep)
    policies = policies_for(dataclasses.replace(settings.sweep, scheduler="asha"), own)
    assert policies.scheduler is own and policies.scheduler.pauses_trials


def test_the_user_metrics_make_a_tasks_metric_known(settings):
    Extensions.of(metrics={"half": half}).check(settings)
    with pytest.raises(ConfigError, match=r"^task\.WNLI\.metric: unknown metric 'half' .*known: "):
        Extensions.of(metrics={"other": half}).check(settings)


@pytest.mark.parametrize(("extensions", "match"), [
    (Extensions.of(scheduler="asha"), r"^scheduler: str is not a sweep.SchedulerPolicy"),
    (Extensions.of(callbacks=[print]), r"^callbacks: builtin_function_or_method not ray.tune.Callback instances$"),
    (Extensions.of(metrics={"acc": half}), r"^metrics: 'acc' is a built-in metric"),
])
def test_a_wrong_extension_is_one_line(settings, extensions, match):
    with pytest.raises(ConfigError, match=match):
        extensions.check(settings)


def test_a_tune_callback_passes(settings):
    Extensions.of(callbacks=[tune.Callback()], metrics={"half": half}).check(settings)


def test_the_policy_and_metrics_travel_to_the_trial_with_its_context(settings):
    """Ray pickles the trainable's parameters and the TrialContext: a policy and a metric defined in a script
    (by value) come back whole."""
    from sweep.trial.train_fn import TrialContext

    def local_metric(predictions, labels) -> float:
        return 1.0

    fields = {f.name: f for f in dataclasses.fields(TrialContext)}
    assert fields["scheduler"].default is None and fields["metrics"].default_factory() == {}
    sent = cloudpickle.loads(cloudpickle.dumps((Mine(settings.sweep), {"local": local_metric})))
    assert isinstance(sent[0], sweep.SchedulerPolicy) and sent[1]["local"](None, None) == 1.0
