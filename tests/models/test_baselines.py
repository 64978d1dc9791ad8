"""Behavioural tests of the baseline routers on a synthetic table with learnable structure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.base import RoutingData
from models.baselines import (
    Cascade, EnsembleRouter, KNNRouter, LogisticRouter, MatrixFactorizationRouter, MLPRouter, Oracle,
    PromptedLLMRouter, RandomRouter, SingleWorker, parse_choice, surface_features,
)
from models.registry import make_router
from models.baselines.synthetic import make_synthetic_table
from evaluation.replay import cross_fit, knob_grid, operating_points

ONE_CALL_ROUTERS = ["random", "oracle", "knn", "logistic", "logistic_tfidf", "mf", "mlp", "ensemble"]


@pytest.fixture(scope="module")
def table() -> RoutingData:
    return make_synthetic_table(n_queries=300, n_workers=3, dim=32, seed=1)


@pytest.fixture(scope="module")
def split(table):
    return table.subset(np.arange(0, 200)), table.subset(np.arange(200, 300))


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    return {name: make_router(name, seed=0).fit(train) for name in ONE_CALL_ROUTERS + ["cascade"]}


def single_costs(data: RoutingData) -> np.ndarray:
    return data.costs.mean(axis=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ONE_CALL_ROUTERS)
def test_single_workers_bracket_every_one_call_router(name, fitted, split):
    _, test = split
    router = fitted[name]
    quality = router.predict_quality(test)
    ops = operating_points(router, quality, test)
    usd = ops.paid.mean(axis=1)
    lo, hi = single_costs(test).min(), single_costs(test).max()
    assert (usd >= lo - 1e-12).all() and (usd <= hi + 1e-12).all()
    # the sweep reaches both ends: λ = 0 spends, the largest λ sends everyone to the cheapest worker
    assert usd[-1] == pytest.approx(lo)


def test_cascade_pays_for_every_call_it_makes(fitted, split):
    _, test = split
    cascade = fitted["cascade"]
    quality = cascade.predict_quality(test)
    cheapest, _ = cascade.decide(quality, test.costs, 0.0)  # threshold 0: the first answer is accepted
    assert (cheapest == 0).all()
    choice, paid = cascade.decide(quality, test.costs, 1.1)  # nothing passes: every worker is called
    assert (choice == 2).all()
    np.testing.assert_allclose(paid, test.costs.sum(axis=1))
    usd = operating_points(cascade, quality, test).paid.mean(axis=1)
    assert usd.min() >= single_costs(test).min() - 1e-12
    assert usd.max() <= test.costs.sum(axis=1).mean() + 1e-12


@pytest.mark.parametrize("name", ONE_CALL_ROUTERS)
def test_cost_never_rises_as_cost_weight_rises(name, fitted, split):
    _, test = split
    router = fitted[name]
    quality = router.predict_quality(test)
    grid = knob_grid(router, quality, test.costs)
    assert np.all(np.diff(grid) > 0)
    paid = operating_points(router, quality, test, grid).paid
    # per query, not just on average: a higher λ never moves any query to a dearer worker
    assert (np.diff(paid, axis=0) <= 1e-15).all()


def test_cascade_cost_never_falls_as_threshold_rises(fitted, split):
    _, test = split
    cascade = fitted["cascade"]
    quality = cascade.predict_quality(test)
    grid = knob_grid(cascade, quality, test.costs)
    paid = operating_points(cascade, quality, test, grid).paid
    assert (np.diff(paid, axis=0) >= -1e-15).all()


def test_single_worker_ignores_the_knob(table):
    router = SingleWorker("w1").fit(table)
    quality = router.predict_quality(table)
    for lam in (0.0, 1e3, 1e9):
        choice, paid = router.decide(quality, table.costs, lam)
        assert (choice == 1).all()
        np.testing.assert_allclose(paid, table.costs[:, 1])
    with pytest.raises(KeyError, match="w9"):
        SingleWorker("w9").fit(table)


def test_oracle_picks_the_cheapest_correct_worker(table):
    oracle = Oracle().fit(table)
    choice = oracle.route(table, cost_weight=0.0)
    picked = table.scores[np.arange(len(table)), choice]
    any_correct = table.scores.max(axis=1)
    np.testing.assert_array_equal(picked, any_correct)
    for i in np.flatnonzero(any_correct == 1)[:50]:
        assert choice[i] == np.flatnonzero(table.scores[i] == 1).min()  # workers are ordered by cost


def test_random_router_is_reproducible_and_per_query(table):
    a = RandomRouter(seed=3).predict_quality(table)
    b = RandomRouter(seed=3).predict_quality(table.subset(np.arange(10, 20)))
    np.testing.assert_array_equal(a[10:20], b)  # the same draw whichever batch a query is in
    assert not np.allclose(a, RandomRouter(seed=4).predict_quality(table))


def test_knn_tunes_k_on_training_queries_only(split):
    train, _ = split
    router = KNNRouter(k_grid=(1, 5, 25)).fit(train)
    assert router.k_ in (1, 5, 25)
    fixed = KNNRouter(k=7).fit(train)
    assert fixed.k_ == 7


def mean_brier(router, train, test) -> float:
    return float(np.mean((router.fit(train).predict_quality(test) - test.scores) ** 2))


@pytest.mark.slow
def test_learned_routers_beat_a_constant_predictor(split):
    train, test = split
    constant = float(np.mean((train.scores.mean(axis=0)[None, :] - test.scores) ** 2))
    for router in (KNNRouter(), LogisticRouter(), MLPRouter(), MatrixFactorizationRouter()):
        assert mean_brier(router, train, test) < constant, router.name


@pytest.mark.parametrize("cls", [MLPRouter, MatrixFactorizationRouter])
def test_torch_routers_train(cls, split):
    train, _ = split
    router = cls(seed=0, n_bags=3).fit(train)
    assert len(router.models_) == 3 and all(e >= 1 for e in router.epochs_)
    torch.manual_seed(0)
    fresh = router._build(router.featurizer.transform(train).shape[1], len(train.workers))
    trained = router.models_[0].state_dict()
    assert any(not torch.equal(p, trained[k]) for k, p in fresh.state_dict().items())
    x = torch.as_tensor(router.featurizer.transform(train), dtype=torch.float32)
    with torch.no_grad():
        target = torch.as_tensor(train.scores, dtype=torch.float32)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(router.models_[0](x), target)
    assert torch.isfinite(loss) and loss.item() < np.log(2)  # better than a coin on its training data
    q = router.predict_quality(train)
    assert np.isfinite(q).all() and ((q >= 0) & (q <= 1)).all()
    # the fused numpy path the online decisions take equals the torch modules
    np.testing.assert_allclose(q, router.predict_with_torch(router.featurizer.transform(train)), rtol=1e-4, atol=1e-6)


def test_logistic_router_with_tfidf_features(split):
    train, test = split
    router = LogisticRouter(use_tfidf=True).fit(train)
    q = router.predict_quality(test)
    assert q.shape == (len(test), 3) and ((q > 0) & (q < 1)).all()
    assert router.tfidf_.vocabulary_  # the n-gram vocabulary came from the training queries


def test_tfidf_keeps_only_the_most_frequent_ngrams_up_to_its_cap(split, monkeypatch):
    from sklearn.feature_extraction.text import CountVectorizer

    from models.baselines import linear

    train, _ = split
    counts = CountVectorizer(analyzer=linear.word_ngrams, min_df=2).fit_transform(train.queries)
    frequency = np.asarray(counts.sum(axis=0)).ravel()
    cap = int(np.sum(frequency > np.sort(frequency)[::-1][40]))  # a cap no tie straddles
    assert 0 < cap < len(frequency)
    monkeypatch.setattr(linear, "TFIDF_MAX_FEATURES", cap)
    router = LogisticRouter(use_tfidf=True).fit(train)
    assert len(router.tfidf_.vocabulary_) == cap
    assert np.isfinite(router.predict_quality(train)).all()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from models.embeddings import SentenceEncoder

    return SentenceEncoder(cache_dir=tmp_path_factory.mktemp("emb"))


def test_cascade_reads_logged_responses_when_present(table, encoder):
    sure = "So the answer is {}. I double-checked each step."
    unsure = "I am not sure how to solve this; maybe it is {}?"
    responses = [[(sure if s else unsure).format((i + j) % 7) for j, s in enumerate(row)]
                 for i, row in enumerate(table.scores)]
    data = RoutingData(**{**vars(table), "responses": responses})
    cascade = Cascade(encoder=encoder).fit(data.subset(np.arange(200)))
    assert cascade.reads_responses_
    quality = cascade.predict_quality(data.subset(np.arange(200, 300)))
    truth = data.scores[200:]
    # the answer's wording gives the outcome away here, so the scorer separates right from wrong answers
    assert quality[truth == 1].mean() > quality[truth == 0].mean() + 0.3
    with pytest.raises(ValueError, match="response"):
        cascade.predict_quality(table.subset(np.arange(5)))


def test_ensemble_averages_members(split):
    train, test = split
    ens = EnsembleRouter([lambda: KNNRouter(k=5), lambda: LogisticRouter()]).fit(train)
    expected = (KNNRouter(k=5).fit(train).predict_quality(test) + LogisticRouter().fit(train).predict_quality(test)) / 2
    np.testing.assert_allclose(ens.predict_quality(test), expected, atol=1e-9)


def test_parse_choice_is_robust():
    workers = ["gpt-4", "gpt-4-turbo", "mixtral"]
    assert parse_choice("<select>2</select>", workers) == 1
    assert parse_choice("I pick <select> 3 </select> because", workers) == 2
    assert parse_choice("Model 1 is best.", workers) == 0
    assert parse_choice("use gpt-4-turbo please", workers) == 1
    assert parse_choice("<select>9</select> mixtral", workers) == 2
    assert parse_choice("no idea", workers) is None


def test_surface_features_count_quantities():
    f = surface_features(["Tom has 3 apples and 12 pears. He eats 3.", "Hi"])
    assert f.shape == (2, 6)
    assert f[0, 2] == 3 and f[0, 3] == 2 and f[0, 5] == 2 and f[1, 2] == 0


def test_cross_fitted_learned_router_beats_random_on_synthetic(table):
    from evaluation.replay import curve_aiq, cost_window

    def aiq_of(name):
        router = make_router(name, seed=0)
        quality = cross_fit(table, lambda seed: make_router(name, seed), k=3, seed=0)
        ops = operating_points(router, quality, table)
        return curve_aiq(ops.paid.mean(axis=1), ops.correct.mean(axis=1), cost_window(table))

    assert aiq_of("knn") > aiq_of("random") + 0.02


@pytest.mark.slow
def test_prompted_llm_router_against_the_local_server(table, llm_url):
    """SmolLM2 on the embedded llama.cpp server picks workers; whatever it replies, every query gets
    exactly one worker, and replies it could not parse fall back to the cheapest and are counted."""
    data = table.subset(np.arange(8))
    router = PromptedLLMRouter(base_url=llm_url).fit(table)
    quality = router.predict_quality(data)
    again = router.predict_quality(data)  # answered from the router's cache, no new call
    np.testing.assert_array_equal(quality.sum(axis=1), 1.0)
    np.testing.assert_array_equal(quality, again)
    assert router.calls == len(set(data.queries))
    assert 0 <= router.parse_failures <= router.calls
    fallback_rows = quality[:, 0] == 1  # worker 0 is the cheapest: where any parse failure lands
    assert fallback_rows.sum() >= router.parse_failures


def test_knn_online_path_matches_the_batch_path(split):
    train, test = split
    router = KNNRouter(k=9).fit(train)
    batch = router.predict_quality(test)  # 100 queries: sklearn's NearestNeighbors
    one_by_one = np.vstack([router.predict_quality(test.subset(np.array([i]))) for i in range(len(test))])
    np.testing.assert_allclose(one_by_one, batch)


def test_folded_linear_outcome_matches_sklearn(split):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from models.baselines.linear import _fold

    train, test = split
    pipe = make_pipeline(StandardScaler(), LogisticRegression(C=0.1)).fit(train.embeddings, train.scores[:, 1])
    np.testing.assert_allclose(_fold(pipe, logistic=True)(test.embeddings), pipe.predict_proba(test.embeddings)[:, 1],
                               rtol=1e-6, atol=1e-9)


def test_hold_out_logistic_stops_past_the_best_penalty_and_keeps_it():
    """Large tables choose C on one hold-out, strongest penalty first, stopping at the first grid point
    worse than the best so far: the C it keeps is the best of the Cs it tried, and the weak end of the
    grid (slow to fit, rejected anyway) is skipped when the loss turns up."""
    from sklearn.linear_model import LogisticRegression

    from models.baselines.linear import C_GRID, HoldOutLogistic

    rng = np.random.default_rng(0)
    x = rng.normal(size=(6000, 40))
    y = (rng.random(6000) < 1 / (1 + np.exp(-(x[:, :3].sum(axis=1))))).astype(int)
    model = HoldOutLogistic(C_GRID, seed=0).fit(x, y)
    tried = sorted(C_GRID)[: len(model.losses_)]
    assert model.C_ == tried[int(np.argmin(model.losses_))]
    assert len(model.losses_) - 1 - int(np.argmin(model.losses_)) <= HoldOutLogistic.PATIENCE
    accuracy = ((x @ model.coef_.ravel() + model.intercept_[0] > 0) == y).mean()
    assert accuracy > 0.75
    # The refit on every row is warm-started from the hold-out path: it must land where a cold fit
    # does, to the solver's tolerance (L-BFGS stops within ~1e-3 of the optimum either way).
    cold = LogisticRegression(C=model.C_, max_iter=3000).fit(x, y)
    np.testing.assert_allclose(model.coef_, cold.coef_, atol=2e-3)
    p_warm = 1 / (1 + np.exp(-(x @ model.coef_.ravel() + model.intercept_[0])))
    np.testing.assert_allclose(p_warm, cold.predict_proba(x)[:, 1], atol=1e-3)
