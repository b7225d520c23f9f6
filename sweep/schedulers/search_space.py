"""A ``sweep.search`` (or ``sweep.pbt.mutations``) dimension as Tune's search-space object."""

from __future__ import annotations

from typing import Any


def search_domain(spec: dict[str, Any], choice_as_list: bool = False):
    """One ``sweep.search`` (or ``sweep.pbt.mutations``) dimension as Tune's domain; a choice as a plain
    list where PBT wants one (it then shifts to a neighbouring value instead of drawing again)."""
    from ray import tune

    if spec["dist"] == "choice":
        return list(spec["values"]) if choice_as_list else tune.choice(list(spec["values"]))
    if spec["dist"] == "loguniform":
        return tune.loguniform(spec["low"], spec["high"])
    return tune.uniform(spec["low"], spec["high"])
