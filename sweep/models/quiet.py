"""Silence transformers' load reports and progress bars around a load or save."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from transformers.utils import logging as hf_logging


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide the load report and progress bar; load errors are still raised as exceptions."""
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()



