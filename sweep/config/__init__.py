"""The configuration: from the command line and Hydra's tree to typed, validated ``Settings``. No torch, no Ray.

- ``settings.py``:     the typed schema (``Settings`` and its groups): configuration only, no run-time state
- ``validate.py``:     the composed config -> ``Settings``, every range / choice / combination checked once
- ``load.py``:         ``sweep.load_settings``: the command line's overrides -> ``Settings``, from Python
- ``defaults.py``:     the defaults several places need (cache folder, MLflow store), one home each
- ``paths.py``:        every path option made absolute once, on the driver, against the working folder
- ``store_home.py``:   where the default MLflow store lives (``runs/mlflow.db``, or an earlier ``./mlflow.db``)
- ``tasks.py``:        the task specs (``conf/task/*.yaml``) as ``TaskSpec``
- ``metric_names.py``: the metric registry by name (what each task kind reports), each task's metric checked
- ``model_limits.py``: the positions a model can take (``max_positions``, offsets) and their checks
- ``command_line.py``: the overrides checked before Hydra writes anything
- ``multirun.py``:     Hydra's multirun callback that compares the sweeps of one ``-m`` run
"""
