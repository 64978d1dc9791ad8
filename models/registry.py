"""Every router by name: the baselines and MTRouter behind one registry.

`make_router(name, seed)` builds a fresh, unfitted router; `single:<worker>` names a single-worker
baseline. Add a router by adding a factory to `ROUTER_FACTORIES`. Leaderboards, the register stage
and the replay command resolve names here, so a new router is on every leaderboard at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from models.base import Router
from models.baselines import (
    Cascade, EnsembleRouter, KNNRouter, LogisticRouter, MatrixFactorizationRouter, MLPRouter, Oracle, RandomRouter,
    SingleWorker,
)
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import build_history_encoder
from models.mtrouter.router import MTRouterRouter

RouterFactory = Callable[[int], Router]


def _ensemble(seed: int) -> Router:
    """Every learned one-call baseline, averaged: kNN, logistic (embedding ⊕ TF-IDF), MLP and MF."""
    return EnsembleRouter(
        [
            lambda: KNNRouter(),
            lambda: LogisticRouter(use_tfidf=True, seed=seed),
            lambda: MLPRouter(seed=seed),
            lambda: MatrixFactorizationRouter(seed=seed),
        ],
        name="ensemble",
    )


def _mtrouter(seed: int) -> Router:
    """MTRouter's outcome estimator on a single-turn table (the history is the query)."""
    return MTRouterRouter(history_encoder=shared_history_encoder(), seed=seed)


@functools.lru_cache(maxsize=1)
def shared_history_encoder():
    """One history encoder for every fold and seed of a process, so each query is embedded once
    (its content-hash cache serves the other folds; cross-fitting builds a fresh router per fold)."""
    return build_history_encoder(MTRouterConfig())


ROUTER_FACTORIES: dict[str, RouterFactory] = {
    "random": lambda seed: RandomRouter(seed=seed),
    "oracle": lambda seed: Oracle(),
    "cascade": lambda seed: Cascade(seed=seed),
    "knn": lambda seed: KNNRouter(),
    "logistic": lambda seed: LogisticRouter(seed=seed),
    "logistic_tfidf": lambda seed: LogisticRouter(use_tfidf=True, seed=seed),
    "mf": lambda seed: MatrixFactorizationRouter(seed=seed),
    "mlp": lambda seed: MLPRouter(seed=seed),
    "ensemble": _ensemble,
    "mtrouter": _mtrouter,
}


def make_router(name: str, seed: int = 0) -> Router:
    if name.startswith("single:"):
        return SingleWorker(name.split(":", 1)[1])
    if name not in ROUTER_FACTORIES:
        raise KeyError(f"unknown router {name!r}; known: {sorted(ROUTER_FACTORIES)} or single:<worker>")
    router = ROUTER_FACTORIES[name](seed)
    router.name = name
    return router
