"""Table 4's ablations as named config switches, and a loop that trains and evaluates each one.

Each ablation changes exactly one thing of the full MTRouter (the tests prove it):
- "ridge": sklearn Ridge instead of the MLP estimator, on the same features.
- "no_router_history": the router sees the task and the current turn only (Table 4's "w/o router
  history"; the selected model still gets the full conversation). "query_only": the task alone.
- "hardcoded_model_features": z_a = standardised attributes; no attribute MLP, residual or projection.
- "no_error_penalty": target S̃_t = S_final for every turn (eq. 5 without Σρ).
- "no_random_router_data": episodes of the random routers are dropped from training.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from models.mtrouter.config import MTRouterConfig

ABLATIONS: dict[str, dict[str, Any]] = {
    "full": {},
    "ridge": {"regressor": "ridge"},
    "no_router_history": {"history_mode": "current_turn"},
    "query_only": {"history_mode": "query_only"},
    "hardcoded_model_features": {"model_features": "hardcoded"},
    "no_error_penalty": {"error_penalty": False},
    "no_random_router_data": {"use_random_router_data": False},
}
# Ablations that mean something for single-turn logged outcomes (no turns, no errors, no policies).
SINGLE_TURN_ABLATIONS = ("full", "ridge", "hardcoded_model_features")


def ablation_config(name: str, base: MTRouterConfig | None = None) -> MTRouterConfig:
    """`base` with the one switch of ablation `name` flipped."""
    if name not in ABLATIONS:
        raise KeyError(f"unknown ablation {name!r}; known: {sorted(ABLATIONS)}")
    return (base or MTRouterConfig()).replace(**ABLATIONS[name])


def ablation_configs(base: MTRouterConfig | None = None, names: Sequence[str] | None = None) -> dict[str, MTRouterConfig]:
    return {n: ablation_config(n, base) for n in (names or ABLATIONS)}


def run_ablations(fit_and_evaluate: Callable[[str, MTRouterConfig], Mapping[str, float]],
                  base: MTRouterConfig | None = None, names: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per ablation: its name, the switch it flips and the metrics `fit_and_evaluate`
    returns for a router trained under that config (e.g. rollouts on the test split)."""
    rows = []
    for name, cfg in ablation_configs(base, names).items():
        metrics = dict(fit_and_evaluate(name, cfg))
        rows.append({"ablation": name, "switch": ABLATIONS[name] or "-", **metrics})
    return pd.DataFrame(rows)
