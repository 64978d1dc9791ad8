"""Baseline routers beside every learned router (design: Evaluation protocol), and a registry of them.

`make_router(name, seed)` builds a fresh, unfitted router from its registry name; `single:<worker>`
names a single-worker baseline. Add a router by adding a factory to the registry dict below.
The registry also names MTRouter's single-turn router (`mtrouter`), so every leaderboard can run it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from models.base import Router
from models.baselines.cascade import Cascade
from models.baselines.features import QueryFeaturizer, surface_features
from models.baselines.knn import KNNRouter
from models.baselines.linear import EnsembleRouter, LogisticRouter
from models.baselines.neural import MatrixFactorizationRouter, MLPRouter
from models.baselines.prompted import PromptedLLMRouter, parse_choice
from models.baselines.simple import Oracle, RandomRouter, SingleWorker

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
    """MTRouter's outcome estimator on a single-turn table (history = the query; models/mtrouter).
    Imported when called: models.mtrouter imports this package (surface features), so a top-level
    import would be circular."""
    from models.mtrouter.router import MTRouterRouter

    return MTRouterRouter(history_encoder=_shared_history_encoder(), seed=seed)


@functools.lru_cache(maxsize=1)
def _shared_history_encoder():
    """One history encoder for every fold and seed of a process, so each query is embedded once
    (its content-hash cache serves the other folds; cross-fitting builds a fresh router per fold)."""
    from models.mtrouter.config import MTRouterConfig
    from models.mtrouter.history import build_history_encoder

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


__all__ = [
    "Cascade", "EnsembleRouter", "KNNRouter", "LogisticRouter", "MLPRouter", "MatrixFactorizationRouter",
    "Oracle", "PromptedLLMRouter", "QueryFeaturizer", "ROUTER_FACTORIES", "RandomRouter", "RouterFactory",
    "SingleWorker", "make_router", "parse_choice", "surface_features",
]
