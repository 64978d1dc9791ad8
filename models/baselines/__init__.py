"""Baseline routers beside every learned router (design: Evaluation protocol).

The registry that builds any router by name, MTRouter included, is models/registry.py.
"""

from __future__ import annotations

from models.baselines.cascade import Cascade
from models.baselines.features import QueryFeaturizer, surface_features
from models.baselines.knn import KNNRouter
from models.baselines.linear import EnsembleRouter, LogisticRouter
from models.baselines.neural import MatrixFactorizationRouter, MLPRouter
from models.baselines.prompted import PromptedLLMRouter, parse_choice
from models.baselines.simple import Oracle, RandomRouter, SingleWorker

__all__ = [
    "Cascade", "EnsembleRouter", "KNNRouter", "LogisticRouter", "MLPRouter", "MatrixFactorizationRouter",
    "Oracle", "PromptedLLMRouter", "QueryFeaturizer", "RandomRouter", "SingleWorker", "parse_choice",
    "surface_features",
]
