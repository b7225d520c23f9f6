"""``key=value`` command-line arguments (``sweep serve``'s), like the sweep's Hydra overrides, with one-line errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class UsageError(ValueError):
    """A malformed, unknown or missing argument; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True)
class Option:
    parse: Callable[[str], Any]
    default: Any
    help: str
    required: bool = False


def as_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise ValueError(f"must be a port in 1..65535, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"must be >= 0, got {text}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


def plain(error: ValueError, text: str) -> str:
    """Python's words for a value that is no number ("invalid literal for int() with base 10") as a person's."""
    message = str(error)
    if message.startswith("invalid literal for int()"):
        return f"expected a whole number, got {text!r}"
    if message.startswith("could not convert string to float"):
        return f"expected a number, got {text!r}"
    return message


def parse_key_values(argv: Sequence[str], options: Mapping[str, Option]) -> dict[str, Any]:
    """Values for every option: given ones parsed and checked, the rest their defaults."""
    given: dict[str, Any] = {}
    for arg in argv:
        key, sep, text = arg.partition("=")
        if not sep or not key:
            raise UsageError(f"{arg!r}: arguments are key=value (known keys: {', '.join(options)})")
        if key not in options:
            raise UsageError(f"{key}: unknown option (known: {', '.join(options)})")
        if key in given:
            raise UsageError(f"{key}: given twice")
        try:
            given[key] = options[key].parse(text)
        except ValueError as e:
            raise UsageError(f"{key}: {plain(e, text)}") from None
    missing = [k for k, o in options.items() if o.required and k not in given]
    if missing:
        raise UsageError(f"{', '.join(missing)}: required (e.g. {missing[0]}=...)")
    return {k: given.get(k, o.default) for k, o in options.items()}


def usage(prog: str, options: Mapping[str, Option]) -> str:
    lines = [f"usage: {prog} key=value ...", ""]
    width = max(len(k) for k in options) + 2
    for key, option in options.items():
        if option.required:
            suffix = " (required)"
        elif option.default is None:  # the help says what happens when it is unset
            suffix = ""
        else:
            default = str(option.default).lower() if isinstance(option.default, bool) else option.default
            suffix = f" (default: {default})"
        lines.append(f"  {key + '=':<{width}} {option.help}{suffix}")
    return "\n".join(lines)
