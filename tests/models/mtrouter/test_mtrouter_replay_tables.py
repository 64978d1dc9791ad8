"""MTRouterRouter on the logged-outcome tables users bring (docs/replay_format.md): many workers,
graded scores, missing cells, unevenly described workers, slashes in names, tiny tables, and the
`routerops replay` command. Small generated tables test mechanics only — no accuracy claims."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from models.base import RoutingData
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.router import MTRouterRouter, routing_attributes
from evaluation.replay import cross_fit
from routerops.errors import InputError


@pytest.fixture(scope="module")
def cfg() -> MTRouterConfig:
    return MTRouterConfig(encoder_kind="hashing", hashing_dim=128, hidden_dims=(32,), attr_embed_dim=8,
                          residual_dim=4, model_embed_dim=8, max_epochs=20, patience=3, disk_cache=False)


def logged_table(n: int = 60, k: int = 3, graded: bool = False, missing: float = 0.0, seed: int = 0,
                 attributes: dict | None = None) -> RoutingData:
    """n queries × k workers named like hub models ("org-j/model-j"); dearer workers are better on
    average, and a query's difficulty shows in its text (how many numbers it adds)."""
    rng = np.random.default_rng(seed)
    workers = [f"org-{j}/model-{j}" for j in range(k)]
    difficulty = rng.integers(1, 6, size=n)
    skill = np.linspace(0.5, 4.5, k)
    p = 1 / (1 + np.exp(-(skill[None, :] - difficulty[:, None] + 0.5)))
    scores = p.round(2) if graded else (rng.random((n, k)) < p).astype(float)
    scores[rng.random((n, k)) < missing] = np.nan
    queries = [f"Q{i}: add " + " and ".join(str(v) for v in rng.integers(2, 99, size=d)) for i, d in enumerate(difficulty)]
    costs = np.geomspace(1e-4, 1e-2, k)[None, :] * (1 + difficulty[:, None] / 10)
    return RoutingData([f"t/{i}" for i in range(n)], queries, workers, scores, costs,
                       worker_attributes=attributes or {})


def fitted(cfg: MTRouterConfig, data: RoutingData) -> MTRouterRouter:
    return MTRouterRouter(cfg, seed=0).fit(data)


def test_twelve_workers_named_with_slashes_cross_fit(cfg):
    data, short = logged_table(n=40, k=12), cfg.replace(max_epochs=5)
    quality = cross_fit(data, lambda seed: MTRouterRouter(short, seed=seed), k=2, seed=0)
    assert quality.shape == (40, 12) and np.isfinite(quality).all()
    router = fitted(short, data)
    assert router.table.models == tuple(data.workers)  # columns stay in the table's worker order
    chosen = router.route(data, cost_weight=0.0)
    assert ((0 <= chosen) & (chosen < 12)).all()


def test_graded_scores_train_a_finite_estimator(cfg):
    data = logged_table(graded=True)
    assert ((data.scores > 0) & (data.scores < 1)).any()  # really graded, not 0/1
    router = fitted(cfg, data)
    quality = router.predict_quality(data)
    assert np.isfinite(quality).all()
    assert all(np.isfinite(r.train_loss).all() for r in router.estimator.reports)


def test_missing_cells_are_not_training_examples_but_are_scored(cfg):
    data = logged_table(n=60, k=4, missing=0.25)
    router = MTRouterRouter(cfg, seed=0)
    router.fit(data)
    rows = np.arange(len(data))
    cells = router._cells(router._histories(data), data, rows)
    assert len(cells) == int(np.isfinite(data.scores).sum()) < data.scores.size
    assert np.isfinite(cells.targets).all()
    assert np.isfinite(router.predict_quality(data)).all()  # the missing cells get an estimate too


def test_a_worker_never_logged_still_gets_an_estimate(cfg):
    data = logged_table(n=40, k=3)
    data.scores[:, 1] = np.nan
    assert np.isfinite(fitted(cfg, data).predict_quality(data)).all()


def test_attributes_not_given_for_every_worker_are_dropped_with_a_warning():
    attributes = {"org-0/model-0": {"context": 8e3, "cutoff": 2023.5}, "org-1/model-1": {"context": 3.2e4},
                  "org-2/model-2": {"context": 1.3e5, "cutoff": 2024.5}}
    data = logged_table(k=3, attributes=attributes)
    with pytest.warns(UserWarning, match="cutoff"):
        table = routing_attributes(data)
    assert table.features == ("context", "mean_cost_usd")
    assert table.values[:, 0].tolist() == [8e3, 3.2e4, 1.3e5]


def test_a_table_without_any_attributes_uses_mean_cost_alone():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to drop, nothing to warn about
        table = routing_attributes(logged_table(k=3, attributes={"org-1/model-1": {}}))
    assert table.features == ("mean_cost_usd",)


def test_a_worker_that_is_never_best_is_ranked_below_the_rest(cfg):
    data = logged_table(n=80, k=3)
    data.scores[:, 0] = 0.0  # the cheapest worker never answers right
    quality = fitted(cfg, data).predict_quality(data)
    assert quality[:, 0].mean() < quality[:, 1:].mean()


def test_thirty_queries_still_validate_and_stop_early(cfg):
    rng = np.random.default_rng(3)
    data = logged_table(n=30, k=3)
    data.scores = (rng.random(data.scores.shape) < 0.5).astype(float)  # noise: validation loss cannot keep falling
    router = fitted(cfg.replace(linear_head=False, max_epochs=100, patience=2, dropout=0.0), data)
    report = router.estimator.reports[0]
    assert report.val_loss, "a 30-query table must still hold out validation queries"
    assert report.stopped_early and len(report.train_loss) < 100
    assert report.best_epoch < len(report.train_loss)
    quality = cross_fit(data, lambda seed: MTRouterRouter(cfg, seed=seed), k=5, seed=0)  # 24 queries per fit
    assert np.isfinite(quality).all()


@pytest.mark.parametrize("n", [1, 2])
def test_fewer_than_three_queries_fit_without_the_linear_head(cfg, n):
    router = fitted(cfg, logged_table(n=n, k=3))
    assert router.estimator.head is None
    assert np.isfinite(router.predict_quality(logged_table(n=5, k=3, seed=1))).all()


def test_a_table_with_no_observed_score_is_an_input_error(cfg):
    data = logged_table(n=10, k=2)
    data.scores[:] = np.nan
    with pytest.raises(InputError, match="scores"):
        fitted(cfg, data)


@pytest.mark.slow
def test_prediction_in_chunks_equals_one_batch(cfg):
    data = logged_table(n=50, k=5)
    router = fitted(cfg, data)
    whole = router.predict_quality(data)
    router.PREDICT_ROWS = 7  # one query (5 candidates) per estimator call
    np.testing.assert_allclose(router.predict_quality(data), whole, rtol=1e-5, atol=1e-6)


def test_the_registry_shares_one_history_encoder_across_folds_and_seeds():
    from models.registry import ROUTER_FACTORIES, make_router

    assert "mtrouter" in ROUTER_FACTORIES
    first, second = make_router("mtrouter", 0), make_router("mtrouter", 1)
    assert isinstance(first, MTRouterRouter) and first.name == "mtrouter"
    assert first.encoder is second.encoder and first.cfg.seed == 0 and second.cfg.seed == 1


# ------------------------------------------------------------------ through `routerops replay`

WORKERS = ("mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview")


def write_csv_table(path, n: int = 30):
    """The docs/replay_format.md CSV (commas and quotes in the query text included)."""
    rows = []
    for i in range(n):
        query = f'Tom has {i} apples, and "buys" {i % 4 + 1} more. How many now?'
        for worker, right, completion in ((WORKERS[0], i % 3 != 0, 90), (WORKERS[1], i % 7 != 0, 110)):
            rows.append({"dataset": "toy", "query_id": f"toy/{i:03d}", "query": query, "worker": worker,
                         "score": int(right), "prompt_tokens": 200 + i, "completion_tokens": completion})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.mark.slow
def test_routerops_replay_runs_mtrouter_from_a_csv_table(tmp_path, monkeypatch):
    from models.registry import shared_history_encoder
    from cli.main import main

    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    shared_history_encoder.cache_clear()  # its disk cache then lives under this test's tmp_path
    table = write_csv_table(tmp_path / "toy.csv")
    prices = tmp_path / "prices.yaml"
    prices.write_text("version: toy-1\neffective_date: 2026-01-01\nprices:\n"
                      f"  {WORKERS[0]}: {{input_per_1m: 0.6, output_per_1m: 0.6}}\n"
                      f"  {WORKERS[1]}: {{input_per_1m: 10.0, output_per_1m: 30.0}}\n")
    out = tmp_path / "board.csv"
    try:
        code = main(["replay", "--table", str(table), "--prices", str(prices), "--routers", "mtrouter", "random",
                     "--k", "3", "--seeds", "0", "--bootstrap", "10", "--out", str(out)])
    finally:
        shared_history_encoder.cache_clear()
    assert code == 0
    board = pd.read_csv(out).set_index("router")
    assert set(board.index) == {"mtrouter", "random", *(f"single:{w}" for w in WORKERS)}
    assert np.isfinite(board.loc["mtrouter", ["aiq", "apgr", "cpt50", "cpt80"]].astype(float)).all()
    assert out.with_suffix(".curves.csv").is_file() and out.with_suffix(".meta.json").is_file()
