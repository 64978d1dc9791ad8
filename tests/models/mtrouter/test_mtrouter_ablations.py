"""Each Table 4 ablation switch changes exactly what it claims, and nothing else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.mtrouter.ablations import ABLATIONS, ablation_config, run_ablations
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.dataset import turn_examples
from models.mtrouter.estimator import OutcomeEstimator, RidgeOutcomeEstimator, build_estimator
from models.mtrouter.linear_head import LinearHead
from models.mtrouter.model_encoder import ModelEncoder, attribute_table


def changed_fields(a: MTRouterConfig, b: MTRouterConfig) -> set[str]:
    return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_each_ablation_flips_only_its_own_switch(name, tiny_cfg):
    assert changed_fields(tiny_cfg, ablation_config(name, tiny_cfg)) == set(ABLATIONS[name])


def examples(cfg, tables, encoder):
    episodes, turns, prompts = tables
    return turn_examples(episodes, turns, encoder, cfg, prompts)


def test_ridge_swaps_only_the_regressor(tiny_cfg, tables, tiny_encoder, pool, book):
    full, ridge = examples(tiny_cfg, tables, tiny_encoder), examples(ablation_config("ridge", tiny_cfg), tables, tiny_encoder)
    assert full.texts == ridge.texts and np.array_equal(full.targets, ridge.targets)
    table = attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, book)
    assert isinstance(build_estimator(table, tiny_cfg), OutcomeEstimator)
    assert isinstance(build_estimator(table, ablation_config("ridge", tiny_cfg)), RidgeOutcomeEstimator)


@pytest.mark.parametrize("name, kept_pairs", [("no_router_history", 1), ("query_only", 0)])
def test_router_history_ablations_only_shorten_what_the_router_sees(name, kept_pairs, tiny_cfg, tables, tiny_encoder):
    full, cut = examples(tiny_cfg, tables, tiny_encoder), examples(ablation_config(name, tiny_cfg), tables, tiny_encoder)
    assert full.workers == cut.workers and np.array_equal(full.targets, cut.targets)
    multi = [i for i, t in enumerate(full.texts) if t.count("[Turn ") >= 1]
    assert multi, "fixture must contain turns with history"
    for i in range(len(full.texts)):
        assert cut.texts[i].startswith(full.texts[i].split("\n[Turn ")[0])  # same task block
        assert cut.texts[i].count("[Turn ") == min(kept_pairs, full.texts[i].count("[Turn "))
        if kept_pairs:
            assert full.texts[i].endswith(cut.texts[i].split("\n", 2)[-1])  # the kept pair is the latest one


def test_hardcoded_model_features_drop_the_learned_encoder_and_residual(tiny_cfg, pool, book, tables, tiny_encoder):
    cfg = ablation_config("hardcoded_model_features", tiny_cfg)
    table = attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, book)
    learned, hardcoded = ModelEncoder(table, tiny_cfg), ModelEncoder(table, cfg)
    assert hasattr(learned, "residual") and not hasattr(hardcoded, "residual")
    assert list(hardcoded.parameters()) == []
    assert LinearHead(table, cfg).by_attributes and not LinearHead(table, tiny_cfg).by_attributes
    full, ablated = examples(tiny_cfg, tables, tiny_encoder), examples(cfg, tables, tiny_encoder)
    assert full.texts == ablated.texts and np.array_equal(full.targets, ablated.targets)


def test_no_error_penalty_only_changes_targets(tiny_cfg, tables, tiny_encoder):
    episodes, turns, _ = tables
    full = examples(tiny_cfg, tables, tiny_encoder)
    plain = examples(ablation_config("no_error_penalty", tiny_cfg), tables, tiny_encoder)
    assert full.texts == plain.texts and full.workers == plain.workers
    score = episodes.set_index("episode_id")["score"]
    assert np.array_equal(plain.targets, score.loc[plain.episode_ids].to_numpy())  # S̃_t = S_final
    # The full target is lower exactly where an error (the cheap worker's) lies at or after turn t.
    cheap_turns = turns[turns["worker"] == "cheap"].groupby("episode_id")["turn_index"].max()
    later_error = np.array([cheap_turns.get(e, -1) >= t for e, t in zip(full.episode_ids, full.turn_index)])
    assert later_error.any() and (~later_error).any()
    assert (full.targets[later_error] < plain.targets[later_error]).all()
    assert np.array_equal(full.targets[~later_error], plain.targets[~later_error])


def test_no_random_router_data_drops_exactly_the_random_episodes(tiny_cfg, tables, tiny_encoder):
    episodes, turns, _ = tables
    full = examples(tiny_cfg, tables, tiny_encoder)
    kept = examples(ablation_config("no_random_router_data", tiny_cfg), tables, tiny_encoder)
    random_ids = set(episodes.loc[episodes["policy"].isin(tiny_cfg.random_policies), "episode_id"])
    assert len(full.texts) - len(kept.texts) == turns["episode_id"].isin(random_ids).sum()
    full_rows = {(t, w, y) for t, w, y in zip(full.texts, full.workers, full.targets)}
    assert {(t, w, y) for t, w, y in zip(kept.texts, kept.workers, kept.targets)} <= full_rows


def test_run_ablations_reports_one_row_per_switch(tiny_cfg):
    table = run_ablations(lambda name, cfg: {"regressor_is_mlp": float(cfg.regressor == "mlp")}, tiny_cfg)
    assert list(table["ablation"]) == list(ABLATIONS)
    assert table.set_index("ablation").loc["ridge", "regressor_is_mlp"] == 0.0
