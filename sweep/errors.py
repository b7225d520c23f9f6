"""Errors shared by the staging modules (kept apart so they import nothing heavy)."""


class StagingError(ValueError):
    """A model or data source is missing or unusable; the message says which and what to do."""
