"""How many intervals overlap at most: trials holding their resources at one time (the sweep tests)."""

from __future__ import annotations


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The peak number of [start, end] spans open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak
