"""How sure a figure is: percentile bootstrap intervals over samples or routes.

A figure on a report set is a mean over a few hundred planning samples or a few dozen routes; the
interval says how much of it is the draw of samples. Resampling is over whole rows (a sample or a
route), so paired figures (the model's L2 over the AR model's on the same samples) keep their pairing.

    lo, hi = bootstrap_interval(np.array(l2_at_4s), np.mean)                       # [n] -> mean's 95 % interval
    lo, hi = bootstrap_interval(np.stack([model, ar], 1), lambda r: r[:, 0].mean() / r[:, 1].mean())
"""
from __future__ import annotations

from typing import Callable

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def bootstrap_interval(rows: np.ndarray, statistic: Callable[[np.ndarray], float], *, resamples: int = RESAMPLES,
                       level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(rows)``, resampling the rows (axis 0) with replacement.

    ``rows``: [n] or [n, k] (one row per sample or route). Deterministic for a given ``seed``."""
    rows = np.asarray(rows, dtype=float)
    if rows.ndim == 0 or len(rows) == 0:
        raise ValueError("bootstrap_interval: no rows to resample")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_interval: level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(rows), size=(resamples, len(rows)))           # [resamples, n]
    values = np.array([statistic(rows[p]) for p in picks])
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return float(lo), float(hi)


def format_with_interval(value: float, interval: tuple[float, float], digits: int = 3) -> str:
    """``1.234 [1.100, 1.400]``."""
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
