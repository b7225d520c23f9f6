"""The error types every layer raises for a person's mistake, kept apart so that the driver (and
``python -m sweep``'s one-line error) can catch them without importing torch, transformers or Ray.

Each message names what was wrong and what to do; the command (sweep/cli/) prints it as one line, exit 2.
"""


class ConfigError(ValueError):
    """The composed config is invalid; the message names the key and what is allowed."""


class StagingError(ValueError):
    """A model or data source is missing or unusable; the message says which and what to do."""


class DataFormatError(ValueError):
    """Task data is missing or malformed; the message names the file (and line) and the fix."""


class ModelSourceError(ValueError):
    """No usable local copy of a model: says which model, where we looked, and what to do."""


class ResourceError(ValueError):
    """The cluster can never run one trial as asked; the message says what to change."""


class TrackingError(RuntimeError):
    """The MLflow store cannot be used; the message names the URI and what to do."""


class OutDirInUseError(RuntimeError):
    """Another sweep holds out_dir's lock; the message names its pid and start, and what to do."""


class SweepStopped(KeyboardInterrupt):
    """SIGTERM/SIGINT stopped the sweep: its trials were stopped and its state saved for resume=true.
    A KeyboardInterrupt, so that no ``except Exception`` on the way out swallows it."""

    def __init__(self, signal_name: str, signal_number: int) -> None:
        super().__init__(signal_name)
        self.signal_name, self.signal_number = signal_name, signal_number

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number  # the shell's code for a process ended by that signal


class SweepFailed(RuntimeError):
    """Tune's run ended on an error of its own after trials ran: one line; the trials that finished, and
    Tune's state, are kept for ``resume=true`` (the command prints it)."""


class DiskFullError(RuntimeError):
    """A disk filled up while writing: names the folder, the bytes needed and free, and what to set."""


# What a node's staging can refuse (raised from the staging callback before any trial runs).
SOURCE_ERRORS = (StagingError, DataFormatError, ModelSourceError)
# What `python -m sweep` reports as one line instead of a traceback.
USER_ERRORS = (ConfigError, *SOURCE_ERRORS, ResourceError, TrackingError, OutDirInUseError, DiskFullError)
