"""The K-worker router families (models/kworkers): cost-aware labels, calibrated expected utility, and
the price-ordered K-step cascade, on small synthetic tables and on the real nine-model table."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from evaluation.replay import knob_grid, operating_points, run_replay_benchmark
from evaluation.serving.single_turn import ServedRouter
from models.base import RoutingData
from models.baselines.synthetic import make_synthetic_table
from models.kworkers import CalibratedRouter, CostLabelRouter, KStepCascade, cheapest_correct_labels, validation_split
from models.kworkers.cascade import OFF_CHAIN, price_tiers, walk
from models.registry import make_router

NEW = ["cost_label", "cost_label_mlp", "calibrated", "calibrated_ensemble", "kcascade"]
PRICES = np.array([0.1, 0.2, 0.2, 0.9])  # two workers share a price, as six of the nine do


def tied_table(n: int = 320, seed: int = 3) -> RoutingData:
    """Four workers, two at one price: cost = price × query length."""
    base = make_synthetic_table(n_queries=n, n_workers=4, dim=16, seed=seed)
    length = np.array([len(q) for q in base.queries], dtype=float)
    return dataclasses.replace(base, costs=PRICES[None, :] * length[:, None] * 1e-6)


@pytest.fixture(scope="module")
def split():
    table = tied_table()
    return table.subset(np.arange(0, 240)), table.subset(np.arange(240, 320))


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    return {name: make_router(name, seed=0).fit(train) for name in NEW}


# ---------------------------------------------------------------- labels


def test_cheapest_correct_label_breaks_price_ties_by_strength_and_falls_back_to_cheapest():
    scores = np.array([[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1], [0, 0, 1, 0]], dtype=float)
    costs = np.tile(PRICES, (5, 1))
    # worker 2 is right more often (4 of 5) than worker 1 (2 of 5): it wins the $0.2 tie on row 0
    assert cheapest_correct_labels(scores, costs).tolist() == [2, 2, 0, 0, 2]


def separable_table(n: int = 200, seed: int = 0, clustered: bool = False) -> RoutingData:
    """The cheap worker is right exactly when the first embedding coordinate is positive; the dear
    one always; the middle two never: the cheapest correct worker is a function of the query.
    clustered: the queries form two clear groups on that coordinate, as real query sets form topics."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    if clustered:
        emb[:, 0] = np.where(rng.random(n) < 0.5, -2.0, 2.0) + 0.5 * emb[:, 0]
    scores = np.zeros((n, 4))
    scores[:, 0] = emb[:, 0] > 0
    scores[:, 3] = 1.0
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=[f"query {i}" for i in range(n)],
                       workers=["w0", "w1", "w2", "w3"], scores=scores, costs=np.tile(PRICES, (n, 1)) * 1e-6,
                       embeddings=emb)


@pytest.mark.slow
def test_cost_label_router_learns_who_to_call(split, fitted):
    _, test = split
    quality = fitted["cost_label"].predict_quality(test)
    assert quality.shape == (len(test), 4)
    np.testing.assert_allclose(quality.sum(axis=1), 1.0, atol=1e-6)  # a distribution over workers
    table = separable_table()
    train, held = table.subset(np.arange(150)), table.subset(np.arange(150, 200))
    for classifier in ("logistic", "mlp"):
        router = CostLabelRouter(classifier=classifier, seed=0).fit(train)
        choice = router.route(held, 0.0)
        labels = cheapest_correct_labels(held.scores, held.costs)
        assert (choice == labels).mean() >= 0.85, classifier
        # at λ = 0 it pays the dear worker only where the cheap one fails, and stays right
        assert held.scores[np.arange(len(held)), choice].mean() >= 0.85, classifier


def test_cost_label_with_one_label_is_a_constant_router(split):
    train, _ = split
    one = dataclasses.replace(train, scores=np.tile([1.0, 0, 0, 0], (len(train), 1)))
    quality = CostLabelRouter(seed=0).fit(one).predict_quality(train)
    assert (quality.argmax(axis=1) == 0).all()


# ---------------------------------------------------------------- calibration


def test_validation_split_is_disjoint_and_seeded():
    fit_rows, val_rows = validation_split(100, 0.25, seed=4)
    assert len(val_rows) == 25 and not set(fit_rows) & set(val_rows) and len(fit_rows) + len(val_rows) == 100
    assert np.array_equal(val_rows, validation_split(100, 0.25, seed=4)[1])
    assert not np.array_equal(val_rows, validation_split(100, 0.25, seed=5)[1])
    with pytest.raises(ValueError):
        validation_split(1, 0.25, 0)


def test_calibration_is_fitted_on_the_validation_fold_and_helps_there():
    table = tied_table(n=600, seed=7)
    router = CalibratedRouter(base="logistic", val_fraction=0.4, method="isotonic", seed=0).fit(table)
    _, val_rows = validation_split(len(table), 0.4, 0)
    val = table.subset(val_rows)
    raw, calibrated = router._raw(val), router.predict_quality(val)
    assert ((calibrated >= 0) & (calibrated <= 1)).all()
    # Isotonic regression minimises the squared error on the rows it was fitted on: never worse there.
    assert np.mean((calibrated - val.scores) ** 2) <= np.mean((raw - val.scores) ** 2) + 1e-12
    # ...and it changed something: the base alone is not calibrated on this fold.
    assert not np.allclose(raw, calibrated)


def test_recalibrate_on_a_target_sample_moves_only_the_calibration():
    table = tied_table(n=600, seed=7)
    router = CalibratedRouter(base="logistic", method="sigmoid", seed=0).fit(table.subset(np.arange(400)))
    target = table.subset(np.arange(400, 600))
    # a target where the dearest worker is always right: its calibrated P̂ must rise towards 1
    shifted = dataclasses.replace(target, scores=np.column_stack([target.scores[:, :3], np.ones(len(target))]))
    raw_before, before = router._raw(target), router.predict_quality(target)
    router.recalibrate(shifted.subset(np.arange(100)))
    np.testing.assert_allclose(router._raw(target), raw_before)  # base models untouched
    after = router.predict_quality(target)
    assert after[:, 3].mean() > before[:, 3].mean() and after[:, 3].mean() > 0.95


def test_expected_utility_cost_never_rises_with_lambda(split, fitted):
    _, test = split
    for name in ("calibrated", "calibrated_ensemble", "cost_label"):
        router = fitted[name]
        costs = [test.costs[np.arange(len(test)), router.route(test, lam)].mean() for lam in np.geomspace(1e2, 1e7, 12)]
        assert all(b <= a + 1e-15 for a, b in zip(costs, costs[1:])), name


# ---------------------------------------------------------------- K-step cascade


def test_price_tiers_and_walk_charge_every_call():
    assert price_tiers(np.tile(PRICES, (3, 1))) == [[0], [1, 2], [3]]
    accept = np.array([[True, False, False], [False, True, False], [False, False, False]])
    costs = np.tile([1.0, 2.0, 5.0], (3, 1))
    stop, paid = walk(accept, costs)
    assert stop.tolist() == [0, 1, 2] and paid.tolist() == [1.0, 3.0, 8.0]


def test_kcascade_chain_thresholds_and_knob(split, fitted):
    train, test = split
    router = fitted["kcascade"]
    assert len(router.chain_) == 3  # one worker per price tier
    assert router.chain_[0] == 0 and router.chain_[-1] == 3
    # nested: a larger λ never demands more of any step
    assert (np.diff(router.thresholds_, axis=0) <= 1e-12).all()
    quality = router.predict_quality(test)
    off = [j for j in range(4) if j not in router.chain_]
    assert (quality[:, off] == OFF_CHAIN).all()
    # decide reads only the quality matrix: an unfitted cascade decides the same
    fresh = KStepCascade()
    choice0, paid0 = fresh.decide(quality, test.costs, 0.0)
    assert (choice0 == 0).all() and np.allclose(paid0, test.costs[:, 0])
    choice_top, paid_top = fresh.decide(quality, test.costs, 1.01)
    assert (choice_top == 3).all()  # no step clears a level above 1: everyone walks to the end
    np.testing.assert_allclose(paid_top, test.costs[:, router.chain_].sum(axis=1))
    grid = knob_grid(fresh, quality, test.costs)
    ops = operating_points(fresh, quality, test, grid)
    assert (np.diff(ops.paid.mean(axis=1)) >= -1e-15).all()  # a higher knob never costs less


# ---------------------------------------------------------------- through the harness and serving


@pytest.mark.slow
def test_new_routers_run_through_the_replay_harness(split):
    train, test = split
    board = run_replay_benchmark(test, None, NEW, seeds=(0,), n_boot=0, progress=False, train=train, n_jobs=1,
                                 include_singles=True)
    rows = board.set_index("router")
    for name in NEW:
        assert np.isfinite(rows.loc[name, "aiq"]), name
        assert rows.loc[name, "best_accuracy"] <= test.scores.max(axis=1).mean() + 1e-12  # below the oracle


def test_new_routers_register_and_serve_the_same_decisions(split, fitted, tmp_path):
    train, test = split
    for name in NEW:
        served = ServedRouter.from_fitted(fitted[name], train, "test-book", embedding=None)
        quality = served.quality(test)
        assert quality.shape == (len(test), 4) and np.isfinite(quality).all()
        loaded = ServedRouter.load(served.save(tmp_path / name))  # the registered artefact
        np.testing.assert_array_equal(loaded.quality(test), quality)


# ---------------------------------------------------------------- the real nine-model table


@pytest.mark.slow
def test_k_worker_routers_on_the_real_table(shared_data):
    from evaluation.replay import to_routing_data
    from models.embeddings import default_encoder
    from routerops.envs.llmrouter import import_llmrouter, price_book_from_candidates
    from routerops.pricing import PriceBook, Price

    frame = import_llmrouter(shared_data / "llmrouter" / "dcrouter_train.json", count_tokens=len)
    book_raw = price_book_from_candidates(shared_data / "llmrouter" / "llm_candidates.json")
    book = PriceBook(version="t", effective_date=__import__("datetime").date(2025, 1, 1),
                     prices={w: Price(**p) for w, p in book_raw["prices"].items()})
    keep = frame["query_id"].isin(sorted(frame["query_id"].unique(), key=lambda q: int(q.split("/")[1]))[:400])
    data = to_routing_data(frame[keep], book, embed=default_encoder().encode)
    train, test = data.subset(np.arange(300)), data.subset(np.arange(300, 400))
    singles = test.scores.mean(axis=0)
    for name in NEW:
        router = make_router(name, 0).fit(train)
        quality = router.predict_quality(test)
        assert quality.shape == (100, 9) and np.isfinite(quality).all(), name
        choice, _ = router.decide(quality, test.costs, 0.0 if router.knob_name == "cost_weight" else 1.01)
        accuracy = test.scores[np.arange(100), choice].mean()
        assert singles.min() <= accuracy <= test.scores.max(axis=1).mean(), name


# ---------------------------------------------------------------- whole-query vectors (issue 28, item 2)


def test_chunk_pooled_vectors_see_the_whole_query_and_depend_on_its_text_alone():
    from models.chunked_embeddings import ChunkPooledEncoder
    from models.embeddings import default_encoder

    encoder = ChunkPooledEncoder(window=32, max_windows=3)
    short = "What is 2 + 3?"
    assert encoder.windows(short) == [short]
    np.testing.assert_allclose(encoder.encode([short])[0], default_encoder().encode([short])[0], atol=1e-6)
    long = " ".join(f"clue {i}: the cat is not in house {i}." for i in range(40)) + " Where is the cat?"
    windows = encoder.windows(long)
    assert len(windows) == 3 and windows[-1].endswith("Where is the cat?")  # the question at the end is kept
    assert windows[0].startswith("clue 0")
    alone, batched = encoder.encode([long])[0], encoder.encode([short, long, "another text"])[1]
    np.testing.assert_allclose(alone, batched, atol=1e-5)  # a vector is a function of its text
    assert abs(np.linalg.norm(alone) - 1) < 1e-5
    head = default_encoder().encode([long])[0]
    assert float(alone @ head) < 0.999  # the pooled vector read more than the head window
