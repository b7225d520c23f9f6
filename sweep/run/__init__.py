"""Everything that imports Ray (and nothing outside this package does).

- ``autoscale.py``:   the autoscaler read from a live cluster: what it can launch, what it is launching
- ``cluster_request.py``: one standing autoscaler request per cluster, the sum of every sweep's
- ``gate.py``:        Tune's trial generator in dispatch order, shut while a DDP trial places its workers
- ``optuna_search.py``: sweep.search_alg=optuna: Tune's searcher over plan/task_studies, same order and gate
- ``connect.py``:     join the cluster or start a local Ray; the alive nodes (listed here only)
- ``sweep_plan.py``:  the driver's ``SweepPlan`` before any trial: storage, every node staged, sizes, order, ETA
- ``tuner.py``:       one Tune run for every trial (or resume it): the trainable, callbacks, the Tuner, fit
- ``records.py``:     Tune's results and the trials' histories -> one ``TrialRecord`` per trial; checkpoint folders
- ``trial.py``:       one trial: the Tune function (``train_driver_fn``) running a TorchTrainer whose
                      workers run ``train_fn_per_worker`` with a typed ``TrialContext``
- ``halving_scheduler.py``: Tune's side of seed halving: pause a trial at the rung until its task is decided
- ``ended_trials.py``: an ended trial's per-metric analysis (Tune's, never read) leaves the driver's memory
- ``search_space.py``: a sweep.search / sweep.pbt.mutations dimension as Tune's domain
- ``pbt_scheduler.py``: sweep.scheduler=pbt: Tune's PopulationBasedTraining, one population per task
- ``stop.py``:        SIGTERM/SIGINT stop the sweep through Tune's own stop; the resume command line
- ``progress.py``:    the one-line-per-change progress callback
- ``mlflow_runs.py``: every trial's nested MLflow run, logged by the driver from the trials' reports
- ``lost_trials.py``: a trial whose process Ray ended (its memory monitor) is a failed trial, not a crashed Tune run
- ``store_copies.py``: the MLflow records copied to storage.output_prefix while the sweep runs
- ``disk_stop.py``:   a trial's full disk ends the sweep with its one line (resume=true finishes it)
- ``stage_nodes.py``: staging on every node before the first trial (and on nodes that join later),
                      the driver's folders shipped through Ray, the nodes' progress lines
- ``submit.py``:      a sweep as a Ray Job on a running cluster, and its jobs (the command: ``sweep submit``)
- ``local_cluster.py``: multi-node Ray clusters on one machine (nodes with their own disks: ``unshare -m``
                      + tmpfs; the fake-provider autoscaling cluster), ``free_port``: for the tests and
                      scripts/chaos.py, scripts/bench_autoscale.py
"""
