"""The validation fold the K-worker routers fit their calibration and thresholds on: a seeded part
of the rows they are given to fit on, so nothing of the table they are scored on is ever read."""

from __future__ import annotations

import numpy as np

from models.base import RoutingData


def validation_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows the base models fit on, validation rows): a seeded `fraction` of n rows held out (at
    least one row each side once n ≥ 2)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"a validation fold needs at least 2 training queries, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    held = int(np.clip(round(fraction * n), 1, n - 1))
    return np.sort(order[held:]), np.sort(order[:held])


def split_data(data: RoutingData, fraction: float, seed: int) -> tuple[RoutingData, RoutingData]:
    fit_rows, val_rows = validation_split(len(data), fraction, seed)
    return data.subset(fit_rows), data.subset(val_rows)
