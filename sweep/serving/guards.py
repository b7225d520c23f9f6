"""What guards a server's requests: the API key, the body limit and the deadline, as the app's middleware
(outermost first) and as the start-up line says them (never the key itself)."""

from __future__ import annotations

from dataclasses import dataclass

from sweep.serving.api_key import ApiKey
from sweep.serving.body_limit import BodyLimit
from sweep.serving.deadline import Deadline
from sweep.serving.routes import Middleware

MIB = 1 << 20


def size(n: int) -> str:
    """A byte count as a person reads it: ``8 MiB`` for the defaults, ``1000 bytes`` where it is not whole MiB."""
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n} bytes"


@dataclass(frozen=True)
class Guards:
    max_body_bytes: int
    request_timeout_s: float  # 0: no deadline
    api_key: str | None = None  # None: no key needed

    def middleware(self) -> list[Middleware]:
        """The key first (a client without it learns nothing of a route that needs it, not even a body's
        limit; a request for no route goes on to the app's 404 or 405, the answer it gets with the key: api_key.py),
        then the deadline around the body's reading and the handling (a slow body counts), then the body limit."""
        chain: list[Middleware] = [(ApiKey, {"key": self.api_key})] if self.api_key else []
        return [*chain, (Deadline, {"seconds": self.request_timeout_s}),
                (BodyLimit, {"max_bytes": self.max_body_bytes})]

    def describe(self) -> str:
        deadline = f"deadline {self.request_timeout_s:g} s" if self.request_timeout_s else "no deadline"
        key = "api key: required" if self.api_key else "api key: none"
        return f"bodies <= {size(self.max_body_bytes)}, {deadline}, {key}"

    def __repr__(self) -> str:  # never the key, even in a traceback's locals
        return (f"Guards(max_body_bytes={self.max_body_bytes}, request_timeout_s={self.request_timeout_s}, "
                f"api_key={'***' if self.api_key else None})")
