"""Third-party lines a server's user can do nothing about, left out of its log, each by its exact words on the
logger that writes it (never a whole logger, never every warning of a kind): anything else they say still shows."""

from __future__ import annotations

import logging
import warnings

# logger -> the start of each message dropped there, and why nobody can act on it
NOISE: dict[str, tuple[str, ...]] = {
    # vLLM is imported for KServe's OpenAI types only; its engine, which Triton would speed up, never runs here
    "vllm.triton_utils.importing": ("Triton not installed or not compatible",),
    # KServe's ModelServer sizes its executor; no option of `sweep serve` sets it
    "kserve": ("Setting max asyncio worker threads as ",),
    # the ASGI lifespan of an app that has no start-up or shutdown hooks of its own
    "uvicorn.error": ("Waiting for application startup.", "Application startup complete.",
                      "Waiting for application shutdown.", "Application shutdown complete."),
}
# KServe's app, and ours after it (routes.py: the same bytes, NaN as null), answer with FastAPI's ORJSONResponse,
# which FastAPI now deprecates: its warning (at a server's first answer) is for nobody running the server.
DEPRECATED_BY_KSERVE = "ORJSONResponse is deprecated"


class DropMessages(logging.Filter):
    """Drops the records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_third_party() -> None:
    """Install the filters (once: a logger keeps its filters, even through ``logging.config``)."""
    for name, starts in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(starts))
    from fastapi.exceptions import FastAPIDeprecationWarning

    warnings.filterwarnings("ignore", message=DEPRECATED_BY_KSERVE, category=FastAPIDeprecationWarning)
