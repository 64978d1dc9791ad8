"""Baseline routers beside every learned router (design: Evaluation protocol), and a registry of them.

`make_router(name, seed)` builds a fresh, unfitted router from its registry name; `single:<worker>`
names a single-worker baseline. Add a router by adding a factory to the registry dict below.
"""

from __future__ import annotations

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
