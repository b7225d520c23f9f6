"""The one way tests compose the Hydra config (as `python -m sweep` would)."""

from __future__ import annotations

from omegaconf import DictConfig

from sweep.config.validate import compose, compose_settings


def compose_config(*overrides: str) -> DictConfig:
    """The config that `python -m sweep <overrides>` runs with."""
    return compose(*overrides)


def demo_config(*overrides: str) -> DictConfig:
    """The README's demo (tiny model, synthetic data) with ``overrides`` on top."""
    return compose_config("experiment=demo", *overrides)


def demo_settings(*overrides: str):
    """The demo's validated settings (tracking off unless overridden)."""
    return compose_settings("experiment=demo", "tracking=none", *overrides)


def train_config(**values):
    """conf/train/default.yaml, validated, with ``values`` on top (a recipe for finetune() called directly)."""
    from dataclasses import replace

    return replace(compose_settings().train, **values)
