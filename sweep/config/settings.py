"""Typed schema of the composed Hydra config.

OmegaConf checks types and unknown keys against the dataclasses below; ``validate.py`` adds the
range and choice checks that types cannot say.

The defaults a user reads and changes are the YAML files in conf/; a dataclass default below only
fills a key that a group's option leaves out (tests/test_config.py proves the two agree, field by field).

A choice is a ``Literal`` below, the one home of its values: ``validate.CHOICES`` reads them with
``typing.get_args``. OmegaConf cannot hold a Literal, so it checks those fields as ``str`` (a schema
``validate`` derives) and ``validate`` checks the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, get_args

from sweep.config.defaults import TRACKING_URI, default_cache_dir
from sweep.config.tasks import TaskSpec

# The choices (validate.CHOICES reads their values; the messages list them in this order).
Method = Literal["full", "lora", "qlora"]  # qlora: a 4-bit base, a CUDA GPU only
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Padding = Literal["dynamic", "max_length"]
Arch = Literal["roberta", "bert", "gpt2"]  # model.builder.arch: the tiny models built offline
SearchAlg = Literal["random", "optuna"]
Aggregate = Literal["mean", "median"]
Scheduler = Literal["fifo", "asha", "seed_halving", "pbt"]
KeepCheckpoints = Literal["best", "all"]
SearchDist = Literal["loguniform", "uniform", "choice"]  # a sweep.search (or pbt.mutations) dimension
StorageKind = Literal["local", "s3"]
TrackingKind = Literal["none", "mlflow"]
Resume = Literal[False, True, "auto"]  # the config's resume; auto (the RayJob's) means true


@dataclass
class BuilderConfig:
    arch: Arch = "roberta"
    vocab_size: int = 2000
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    max_positions: int = 514


@dataclass
class ModelConfig:
    name: str = "???"
    hub_id: Optional[str] = None  # the Hugging Face Hub repo (model=hub: any id, the name taken from it)
    revision: str = "main"  # a branch, tag or commit of hub_id: resolved once, on the driver, to a commit sha
    path: Optional[str] = None
    package: Optional[str] = None
    builder: Optional[BuilderConfig] = None


@dataclass
class LoraConfig:
    """train.method=lora|qlora: PEFT's LoRA on the model's attention projections (the task head trains in full)."""

    r: int = 8  # the LoRA paper's roberta-base setting (Hu et al. 2021, Table 9)
    alpha: float = 8.0
    dropout: float = 0.1
    target_modules: Optional[list[str]] = None  # null: PEFT's own choice for the architecture (query,value; c_attn)


METHODS: tuple[Method, ...] = get_args(Method)
# train.lr=null: the method's own default. Full fine-tuning keeps the original workflow's 2e-5; LoRA
# takes the LoRA paper's roberta-base learning rate (5e-4 for MNLI/SST-2/QQP/RTE, 4e-4 for the rest).
DEFAULT_LR: dict[Method, float] = {"full": 2e-5, "lora": 5e-4, "qlora": 5e-4}


@dataclass
class TrainConfig:
    lr: Optional[float] = None  # null: DEFAULT_LR of the method (validate fills it in)
    method: Method = "full"  # full | lora | qlora (4-bit base, a CUDA GPU only)
    lora: LoraConfig = field(default_factory=LoraConfig)
    gradient_checkpointing: bool = False  # transformers' own: less activation memory, ~30% more compute
    batch_size: int = 32
    eval_batch_size: int = 64
    epochs: int = 3
    max_seq_length: int = 128
    block_size: int = 128
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    precision: Precision = "auto"
    padding: Padding = "dynamic"
    group_by_length: bool = False
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    num_workers: int = 0
    eval_every: Optional[int] = None  # evaluate every N optimizer steps (and at each epoch end)
    evals_per_epoch: int = 1  # or K evaluations spread evenly over each epoch
    # the seed of the weights a trial creates (the task head, LoRA's A): null = the trial's own seed; a number
    # gives every seed the same start (sweep.soup averages seeds, which needs one)
    init_seed: Optional[int] = None


def with_hparams(train: TrainConfig, point: dict[str, Any]) -> TrainConfig:
    """``train`` with a grid or search point's values: ``lr``, or a nested key such as ``lora.r``."""
    from dataclasses import replace

    flat = {k: v for k, v in point.items() if "." not in k}
    lora = {k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("lora.")}
    return replace(train, **flat, **({"lora": replace(train.lora, **lora)} if lora else {}))


@dataclass
class HalvingConfig:
    """sweep.scheduler=seed_halving: decide once, at fraction ``at`` of training, which trials go on."""

    keep: float = 0.5  # a whole number: that many trials per task; a share in (0, 1): that share
    at: float = 0.25  # the fraction of a trial's training steps; the rung is the first evaluation there


# What a PBT exploit may change mid-training: the optimizer's values, read at every step. Keys that
# fix the run's shape (batch size, epochs, sequence length, the adapters' rank) would not match the
# donor's checkpoint and schedule.
PBT_MUTABLE = ("lr", "weight_decay", "warmup_ratio", "max_grad_norm")


@dataclass
class PbtConfig:
    """sweep.scheduler=pbt: Tune's population-based training, per task."""

    mutations: dict[str, Any] = field(default_factory=dict)  # train key -> {dist, low, high | values}, as `search`
    interval: int = 1  # evaluations between a trial's perturbations (train.evals_per_epoch: mid-epoch ones)
    quantile: float = 0.25  # the bottom share of a task's trials clones the top share
    resample_probability: float = 0.25  # an exploit draws a new value, else perturbs the donor's (x0.8 / x1.2)


SELECTION_KINDS = ("train", "dev_half", "none")  # sweep.selection's values besides an eval split's name


@dataclass
class SweepConfig:
    seeds: list[int] = field(default_factory=lambda: list(range(38, 48)))
    grid: dict[str, Any] = field(default_factory=dict)  # train key -> values; lora.r nests until validate flattens it
    search: dict[str, Any] = field(default_factory=dict)  # train key -> {dist, low, high | values}
    num_samples: int = 1
    search_alg: SearchAlg = "random"  # random (Tune's sampling) | optuna (a TPE study per task, learning from scores)
    search_seed: Optional[int] = None  # the search's seed (random or optuna): the same points again
    seeds_per_point: int = 1  # search_alg=optuna: each point runs on this many seeds, scored by their aggregate
    aggregate: Aggregate = "mean"  # mean | median: what the study is told of a point's seeds
    scheduler: Scheduler = "fifo"
    halving: HalvingConfig = field(default_factory=HalvingConfig)
    pbt: PbtConfig = field(default_factory=PbtConfig)
    max_failures: int = 2
    keep_checkpoints: KeepCheckpoints = "best"  # best: prune all but the exported best model; all: keep every trial's
    predict_test: bool = False  # the best model per task predicts its test split: out_dir/glue_submission.zip
    # where every decision is made (sweep/data/selection.py): train | dev_half | <an eval split's name> | none
    selection: str = "train"
    selection_fraction: float = 0.1  # selection=train: the share of the training rows it takes, in (0, 0.5]
    selection_seed: int = 0  # the seed that draws the selection rows (the same rows for every trial)
    # after the sweep: average the best point's seeds into one model (outputs/soup.py), a candidate beside the best seed
    soup: bool = False


@dataclass
class TaskResources:
    """One task's own trial size (null: the sweep-wide ``resources`` value)."""

    gpus_per_trial: Optional[float] = None
    cpus_per_trial: Optional[float] = None


AUTO = "auto"  # resources.gpus_per_trial=auto: the planner picks each task's GPUs (sweep.plan.makespan.auto_shares)


@dataclass
class ResourcesConfig:
    gpus_per_trial: Any = 1.0  # a number, or "auto"
    cpus_per_trial: float = 1.0
    tasks: dict[str, TaskResources] = field(default_factory=dict)  # per task: +resources.tasks.MNLI.gpus_per_trial=2

    def gpus_for(self, task: str) -> float | str:
        """The task's GPUs per trial: its own setting, else the sweep's (a number or "auto")."""
        own = self.tasks.get(task)
        return own.gpus_per_trial if own is not None and own.gpus_per_trial is not None else self.gpus_per_trial

    def cpus_for(self, task: str) -> float:
        own = self.tasks.get(task)
        return own.cpus_per_trial if own is not None and own.cpus_per_trial is not None else self.cpus_per_trial


@dataclass
class StorageConfig:
    kind: StorageKind = "local"
    data_dir: Optional[str] = None
    model_dir: Optional[str] = None
    cache_dir: str = field(default_factory=default_cache_dir)  # $SWEEP_CACHE_DIR as the StorageConfig is made
    # storage=s3 (credentials only from the AWS chain: never fields here)
    bucket: Optional[str] = None
    endpoint: Optional[str] = None  # null: AWS_ENDPOINT_URL / ENDPOINT_URL, else AWS
    region: Optional[str] = None
    model_key: Optional[str] = None  # null: the model's name, as in the original workflow
    data_key: str = "glue_data"
    max_unpack_gb: float = 64.0
    progress_every_s: float = 10.0  # a long download's progress line, this often (0: every chunk)
    output_prefix: Optional[str] = None  # s3://bucket/prefix: best models + results go there after the sweep
    ship_to_nodes: bool = True  # storage=local: send data_dir / model folders to nodes that do not see them
    # generated GLUE-layout rows instead of the Hub's when no data_dir is given (the demo, tests): only when asked
    synthetic_data: bool = False

    @property
    def synthetic(self) -> bool:
        """Whether the sweep trains on generated rows: asked for, and no data folder or bucket given instead."""
        return self.synthetic_data and self.kind == "local" and self.data_dir is None


@dataclass
class TrackingConfig:
    kind: TrackingKind = "mlflow"
    uri: Optional[str] = TRACKING_URI
    experiment: Optional[str] = None
    required: bool = True
    copy_every_s: float = 300.0  # with storage.output_prefix: the records copied there at least this often
    synthetic_champion: bool = False  # a model trained on synthetic data may become champion


@dataclass
class ClusterConfig:
    address: Optional[str] = None
    storage_path: Optional[str] = None
    shared_storage: bool = False  # storage_path is a folder every node mounts (NFS): allowed on several nodes
    num_cpus: Optional[int] = None
    verbose: bool = False
    scale_timeout_s: float = 900.0
    # What the autoscaler can launch, where the driver cannot read it (KubeRay): [{name, resources, max_workers}]
    node_types: list[Any] = field(default_factory=list)


@dataclass
class Settings:
    """The validated config of one sweep (everything but the task specs is a typed dataclass).

    Made once (``sweep.load_settings``, or the command's Hydra run, through ``validate``) and never
    rewritten: what a run finds (pins, folders staged or shipped) travels in values of its own."""

    tasks: list[TaskSpec]
    model: ModelConfig
    train: TrainConfig
    sweep: SweepConfig
    resources: ResourcesConfig
    storage: StorageConfig
    tracking: TrackingConfig
    cluster: ClusterConfig
    out_dir: Optional[str] = None
    resume: bool = False  # the config's true | false | auto (Resume), as what it means
    # The composed config as written (relative paths, lr null, ...), set by validate: what MLflow logs
    # as the parent's params and config.yaml. Not a setting (equal Settings may be written differently);
    # dataclasses.replace leaves it out, so a changed copy is logged from its own values.
    composed: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)
