"""MTRouter (arXiv 2604.23530): cost-aware multi-turn routing with an outcome estimator over joint
history–model embeddings.

    history.py        h_t serialisation (eq. 2), token-budget truncation, frozen encoder φ + cache
    model_encoder.py  ψ(a) = W[MLP(attr_a); e_a] + b (eq. 3)
    targets.py        error-penalised targets S̃_t (eq. 5-6)
    dataset.py        logged trajectories → training examples
    estimator.py      ŝ_θ = f_θ([z_x; z_a]) (eq. 4) and its training loop (eq. 7, §4.1)
    linear_head.py    closed-form per-model linear head beside the MLP (extension)
    router.py         argmax routing (eq. 8), cost-aware variant, Policy and Router adapters
    ablations.py      Table 4's ablation switches
    config.py         every hyper-parameter, with the paper's defaults

Names are imported lazily so that `import models.mtrouter` does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MTRouterConfig": "config",
    "MTRouter": "router",
    "MTRouterPolicy": "router",
    "MTRouterRouter": "router",
    "OutcomeEstimator": "estimator",
    "HistoryEncoder": "history",
    "ModelEncoder": "model_encoder",
    "turn_targets": "targets",
    "ablation_config": "ablations",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models.mtrouter' has no attribute {name!r}")
    return getattr(importlib.import_module(f"models.mtrouter.{_EXPORTS[name]}"), name)
