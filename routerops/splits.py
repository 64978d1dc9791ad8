"""One seeded split of a table's queries into train / validation / test, shared by every evaluation
on a fixed split (the LM critique controllers, evaluation/critique_lm.py, and the arena,
evaluation/arena.py), so two pipelines given the same seed and fractions judge on the same test queries.

Rows are split by *query* (a query's every worker row falls in one part), from one permutation of
numpy's PCG64 generator; the test part keeps the permutation's order, so "its first N" is a seeded
random subset (how the LM controllers evaluate at demo scale)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from routerops.errors import InputError

PARTS = ("train", "val", "test")


def fixed_split(n: int, seed: int, fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> dict[str, np.ndarray]:
    """Train / val / test row indices from one seeded permutation of the n queries (train and val
    sorted; test in the permutation's order)."""
    order = np.random.default_rng(seed).permutation(n)
    a = int(round(fractions[0] * n))
    b = a + int(round(fractions[1] * n))
    return {"train": np.sort(order[:a]), "val": np.sort(order[a:b]), "test": order[b:]}


def check_split(split: dict[str, np.ndarray], n: int, min_test: int, source: str = "split") -> None:
    """Refuse a split whose parts overlap, miss a query, or whose test part is smaller than `min_test`."""
    rows = np.concatenate([split[p] for p in PARTS])
    if len(rows) != n or len(np.unique(rows)) != n:
        raise InputError(source, "fractions", f"the parts do not cover the {n} queries exactly once")
    if len(split["test"]) < min_test:
        raise InputError(source, "min_test_queries", f"the test part holds {len(split['test'])} queries, "
                         f"fewer than the {min_test} asked for")
