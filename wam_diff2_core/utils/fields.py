"""Settings fields that carry their own help and range, so that a node parameter, a command-line flag or a
YAML key derived from one (``params.spec.field_specs``) never restates them.

    @dataclass(frozen=True)
    class Limits:
        top_speed_mps: float = setting(36.0, "top speed (m/s)", low=0.0, high=100.0)
"""
from __future__ import annotations

import math
from dataclasses import field, fields
from typing import Any


def setting(default: Any, help: str, *, choices: tuple[str, ...] | None = None, low: float | None = None,
            high: float | None = None, **extra: Any) -> Any:
    """A dataclass field whose metadata holds ``help``, ``choices``, ``low``, ``high`` (and ``extra``); a
    list default is copied for each instance."""
    metadata = {"help": help, "choices": choices, "low": low, "high": high, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def check_positive(settings: Any) -> None:
    """ValueError naming the first field of the dataclass ``settings`` that is not a positive finite number."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{f.name}: must be a positive finite number, got {value!r}")
