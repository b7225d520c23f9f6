"""Typed schema of the composed Hydra config.

OmegaConf checks types and unknown keys against the dataclasses below; ``validate.py`` adds the
range and choice checks that types cannot say.

The defaults a user reads and changes are the YAML files in conf/; a dataclass default below only
fills a key that a group's option leaves out (tests/test_config.py proves the two agree).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from sweep.config.tasks import TaskSpec


def default_cache_dir() -> str:
    """As conf/storage/*.yaml: $SWEEP_CACHE_DIR, else ~/.cache/sweep."""
    return os.environ.get("SWEEP_CACHE_DIR") or f"{os.environ.get('HOME', '~')}/.cache/sweep"


@dataclass
class BuilderConfig:
    arch: str = "roberta"
    vocab_size: int = 2000
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    max_positions: int = 514


@dataclass
class ModelConfig:
    name: str = "???"
    hub_id: Optional[str] = None
    path: Optional[str] = None
    package: Optional[str] = None
    builder: Optional[BuilderConfig] = None


@dataclass
class TrainConfig:
    lr: float = 2e-5
    batch_size: int = 32
    eval_batch_size: int = 64
    epochs: int = 3
    max_seq_length: int = 128
    block_size: int = 128
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    precision: str = "auto"
    padding: str = "dynamic"
    group_by_length: bool = False
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    num_workers: int = 0
    eval_every: Optional[int] = None  # evaluate every N optimizer steps (and at each epoch end)
    evals_per_epoch: int = 1  # or K evaluations spread evenly over each epoch


@dataclass
class HalvingConfig:
    """sweep.scheduler=seed_halving: decide once, at fraction ``at`` of training, which trials go on."""

    keep: float = 0.5  # a whole number: that many trials per task; a share in (0, 1): that share
    at: float = 0.25  # the fraction of a trial's training steps; the rung is the first evaluation there


@dataclass
class SweepConfig:
    seeds: list[int] = field(default_factory=lambda: list(range(38, 48)))
    grid: dict[str, list[Any]] = field(default_factory=dict)
    search: dict[str, dict[str, Any]] = field(default_factory=dict)
    num_samples: int = 1
    scheduler: str = "fifo"
    halving: HalvingConfig = field(default_factory=HalvingConfig)
    max_failures: int = 2
    keep_checkpoints: str = "best"  # best: prune all but the exported best model; all: keep every trial's


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
    kind: str = "local"
    data_dir: Optional[str] = None
    model_dir: Optional[str] = None
    cache_dir: str = field(default_factory=lambda: default_cache_dir())
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


@dataclass
class TrackingConfig:
    kind: str = "mlflow"
    uri: Optional[str] = "sqlite:///mlflow.db"
    experiment: Optional[str] = None
    required: bool = True


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
    """The validated config of one sweep (everything but the task specs is a typed dataclass)."""

    tasks: list[TaskSpec]
    model: ModelConfig
    train: TrainConfig
    sweep: SweepConfig
    resources: ResourcesConfig
    storage: StorageConfig
    tracking: TrackingConfig
    cluster: ClusterConfig
    out_dir: Optional[str] = None
    resume: bool = False



