"""Errors about a sweep's sources, kept apart so that the driver can catch them without importing
torch or transformers (data.py and models.py re-export theirs)."""


class StagingError(ValueError):
    """A model or data source is missing or unusable; the message says which and what to do."""


class DataFormatError(ValueError):
    """Task data is missing or malformed; the message names the file (and line) and the fix."""


class ModelSourceError(ValueError):
    """No usable local copy of a model: says which model, where we looked, and what to do."""


# What a node's staging can refuse (raised from the staging callback before any trial runs).
SOURCE_ERRORS = (StagingError, DataFormatError, ModelSourceError)
