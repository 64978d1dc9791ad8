"""The register stage: fit the leaderboard's best learned router, log it to the MLflow registry and
run the promotion gate (tasks/registry.py). DVC runs `python -m tasks.register_stage`."""

from __future__ import annotations

import json

from routerops import schema
from routerops.config import Params, load_params
from routerops.envs.replay import load_logged_outcomes
from routerops.pricing import load_price_book
from routerops.stages import REPORTS, write_json, write_manifest

REGISTRY_REPORT = REPORTS / "registry.json"


def register_best_router(params: Params) -> dict:
    from models.baselines import make_router
    from models.stages import GRID, ROUTER_REPORTS, best_learned_router, split_for_gate
    from routerops.promotion import GateConfig
    from models.replay_bench import routing_data_from_table
    from tasks.registry import register_and_gate
    from tasks.tracking import use_tracking

    cfg = params.register
    family = best_learned_router(ROUTER_REPORTS / "leaderboard.csv", list(cfg.candidates))
    book = load_price_book(params.reprice.price_book)
    data = routing_data_from_table(load_logged_outcomes(GRID), book)
    train_idx, test_idx = split_for_gate(len(data), cfg.test_fraction, cfg.seed)
    train, test = data.subset(train_idx), data.subset(test_idx)
    router = make_router(family, cfg.seed).fit(train)
    gate = GateConfig(objective=cfg.objective, budget_usd=cfg.budget_usd, n_boot=cfg.n_boot, seed=cfg.seed)
    use_tracking(params.track)
    registered, decision = register_and_gate(
        router, train, test, gate, price_book_version=book.version, family=family,
        data_hashes={"grid_sha256": schema.file_sha256(GRID)})
    summary = {"family": family, "name": registered.name, "version": registered.version,
               "model_uri": registered.model_uri, "decision": decision.to_dict()}
    write_json(summary, REGISTRY_REPORT)
    write_manifest("register", cfg, [GRID, ROUTER_REPORTS / "leaderboard.csv"], [REGISTRY_REPORT],
                   {"promoted": float(decision.promote), "candidate_score": float(decision.candidate_score)})
    return summary


def main() -> None:
    print(json.dumps(register_best_router(load_params()), indent=2, default=str))


if __name__ == "__main__":
    main()
