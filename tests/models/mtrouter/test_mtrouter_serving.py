"""Saving and reloading a fitted MTRouter (no pickle; identical scores), and the served decision rule
with its input checks (evaluation/serving/mtrouter.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from models.mtrouter.history import Interaction
from models.mtrouter.router import MTRouter
from evaluation.serving.mtrouter import STOP_CHOICE, ServedMTRouter
from routerops.errors import InputError

WORKERS = ["cheap", "mid", "dear"]
HISTORIES = [
    ("hard puzzle 99: combine the numbers 99 and 102 carefully", []),
    ("easy puzzle 98: combine the numbers 98 and 101 carefully", []),
    ("hard puzzle 97: combine 97 and 100", [Interaction("cheap says 1", "observation after turn 1"),
                                           Interaction("dear says 2", "wrong, try again")]),
]


@pytest.fixture(scope="module")
def fitted(pool, book, tiny_cfg, tables):
    episodes, turns, prompts = tables

    def fit(**changes) -> MTRouter:
        return MTRouter(pool, book, tiny_cfg.replace(**changes)).fit(episodes, turns, prompts)

    return fit


def all_scores(router: MTRouter) -> np.ndarray:
    return np.stack([router.score(router.features_of(task, hist), WORKERS) for task, hist in HISTORIES])


@pytest.mark.parametrize("changes", [
    {},  # MLP + per-model linear head
    {"surface_features": True, "ensemble": 2},
    {"linear_head": False},
    {"regressor": "ridge"},  # Table 4's Ridge ablation
    {"model_features": "hardcoded"},  # joint linear head on attributes
])
def test_round_trip_gives_identical_scores(fitted, tmp_path, changes):
    router = fitted(**changes)
    path = router.save(tmp_path / "router")
    assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "estimator.pt", "mtrouter.json"]
    loaded = MTRouter.load(path)
    np.testing.assert_array_equal(all_scores(loaded), all_scores(router))
    assert loaded.cfg == router.cfg and loaded.expected_cost == router.expected_cost
    assert loaded.pool == router.pool and loaded.price_book == router.price_book
    meta = json.loads((path / "mtrouter.json").read_text())
    assert meta["encoder_id"] == router.encoder.text_encoder.encoder_id and meta["config"]["encoder_kind"] == "hashing"


def test_save_replaces_a_previous_router_and_rejects_a_foreign_directory(fitted, tmp_path):
    first, second = fitted(seed=0), fitted(seed=1, regressor="ridge")
    first.save(tmp_path / "r")
    second.save(tmp_path / "r")
    np.testing.assert_array_equal(all_scores(MTRouter.load(tmp_path / "r")), all_scores(second))
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temporary directories left behind
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="mtrouter.json missing"):
        MTRouter.load(tmp_path / "empty")


def frame(**columns) -> pd.DataFrame:
    base = {"task": [HISTORIES[0][0], HISTORIES[1][0]], "history": ["[]", json.dumps(
        [{"action": "cheap says 1", "observation": "observation after turn 1"}])]}
    return pd.DataFrame({**base, **columns})


def test_served_router_follows_the_routing_rule(fitted):
    router = fitted()
    served = ServedMTRouter(router)
    out = served.predict(frame())
    assert list(out.columns) == ["worker"] + [f"score:{w}" for w in WORKERS]
    for i, (task, history) in enumerate([(HISTORIES[0][0], []), (HISTORIES[1][0], [Interaction(
            "cheap says 1", "observation after turn 1")])]):
        scores = router.score(router.features_of(task, history), WORKERS)
        np.testing.assert_array_equal(out.filter(like="score:").to_numpy()[i], scores)
        assert out.worker[i] == WORKERS[router.best_index(WORKERS, scores)]
    assert out.worker[0] == "dear"  # only the dear worker solves hard tasks (conftest's world)

    limited = served.predict(frame(budget_usd=[router.expected_cost["mid"]] * 2, turns_left=[0, 3],
                                   candidates=['["cheap", "mid"]', None]))
    assert limited.worker[0] == STOP_CHOICE  # no turn left
    assert limited.worker[1] in ("cheap", "mid")  # dear is over the remaining budget
    assert np.isnan(limited["score:dear"][0]) and not np.isnan(limited["score:dear"][1])
    broke = served.predict(frame(budget_usd=[0.0, 0.0]))
    assert list(broke.worker) == [STOP_CHOICE] * 2


@pytest.mark.slow
@pytest.mark.parametrize("bad, field", [
    (frame().drop(columns=["history"]), "history"),
    (frame(candidates=['["cheap", "gpt-9"]', None]), "candidates[0]"),
    (frame(history=["[{\"observation\": \"x\"}]", "[]"]), "history[0][0]"),
    (frame(history=["not json", "[]"]), "history[0]"),
    (frame(budget_usd=[-1.0, 0.1]), "budget_usd[0]"),
    (frame(task=["", "x"]), "task[0]"),
])
def test_bad_input_names_the_field(fitted, bad, field):
    with pytest.raises(InputError) as err:
        ServedMTRouter(fitted()).predict(bad)
    assert err.value.field == field, str(err.value)


@pytest.mark.slow
def test_a_router_saved_before_encoder_backends_loads_with_torch(fitted, tmp_path):
    """Old saves have no `encoder_backend`: they were embedded with plain torch, not the new default."""
    path = fitted().save(tmp_path / "router")
    meta = json.loads((path / "mtrouter.json").read_text())
    meta["config"].pop("encoder_backend")
    (path / "mtrouter.json").write_text(json.dumps(meta))
    assert MTRouter.load(path).cfg.encoder_backend == "torch"
