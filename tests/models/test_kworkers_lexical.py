"""The whole-query lexical routers (models/kworkers/lexical.py) on a tiny table whose answer is in the
words and not in the sentence vectors: they must learn who to call from the text, keep every statistic
to the training queries, search neighbours as KNNRouter does, and pass through the registry, the
replay harness's ensemble rule and serving unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from evaluation.replay import run_replay_benchmark
from evaluation.serving.single_turn import ServedRouter
from models import registry
from models.base import RoutingData
from models.baselines.knn import KNNRouter
from models.kworkers.lexical import LexicalFeaturizer, LexicalKNNRouter, LexicalLogisticRouter, marker_features

PRICES = np.array([0.1, 0.2, 0.2, 0.9])
FILLER = ["river", "blue", "table", "seven", "music", "stone", "cloud", "paper", "green", "light"]


def wordy_table(n: int = 200, seed: int = 0) -> RoutingData:
    """Half the queries are logic puzzles, half ask for code; the cheap worker w0 is right exactly on
    the puzzles, w3 always, w1 and w2 never. The embeddings are noise, so only the text tells."""
    rng = np.random.default_rng(seed)
    puzzle = rng.random(n) < 0.5
    queries = []
    for i in range(n):
        filler = " ".join(rng.choice(FILLER, size=4))
        queries.append(f"Solve this logic puzzle about houses and owners: {filler}?" if puzzle[i]
                       else f"Write a python function that returns {filler}; def f(): return {i}")
    scores = np.zeros((n, 4))
    scores[:, 0] = puzzle
    scores[:, 3] = 1.0
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=queries, workers=["w0", "w1", "w2", "w3"],
                       scores=scores, costs=np.tile(PRICES, (n, 1)) * 1e-6,
                       embeddings=rng.normal(size=(n, 8)).astype(np.float32))


@pytest.fixture(scope="module")
def split():
    table = wordy_table()
    return table.subset(np.arange(150)), table.subset(np.arange(150, 200))


@pytest.mark.parametrize("router", [LexicalLogisticRouter(), LexicalKNNRouter()], ids=["lexical", "knn_lexical"])
def test_lexical_routers_learn_who_to_call_from_the_words(router, split):
    train, test = split
    quality = router.fit(train).predict_quality(test)
    assert quality.shape == (len(test), 4) and ((quality >= 0) & (quality <= 1)).all()
    assert roc_auc_score(test.scores[:, 0], quality[:, 0]) >= 0.95
    # at a λ that pays the dear worker only where the cheap one looks wrong: right, and cheaper
    accuracies = [test.scores[np.arange(len(test)), choice].mean()
                  for choice, paid in (router.decide(quality, test.costs, lam) for lam in np.geomspace(1e3, 1e7, 40))
                  if paid.mean() < 0.8 * test.costs[:, 3].mean()]
    assert accuracies and max(accuracies) >= 0.95


def test_sentence_vectors_alone_cannot_on_this_table(split):
    """The control: kNN on the (noise) embeddings does no better than chance, so the lexical routers'
    success above comes from the text."""
    train, test = split
    quality = KNNRouter().fit(train).predict_quality(test)
    assert roc_auc_score(test.scores[:, 0], quality[:, 0]) < 0.75


def test_a_worker_constant_on_train_gets_its_base_rate(split):
    train, test = split
    quality = LexicalLogisticRouter().fit(train).predict_quality(test)
    np.testing.assert_allclose(quality[:, 1:3], 0.0)
    np.testing.assert_allclose(quality[:, 3], 1.0)


def test_marker_features_count_code_maths_options_and_layout():
    rows = marker_features(["def f(x):\n    return x;", r"Find $x$ if x^2 = 4 and \frac{1}{2}", "Pick one: (A) red (B) blue?",
                            "plain words"])
    code, math, options, questions, lines, digits, capitals = rows.T
    assert code[0] > 0 and code[3] == 0
    assert math[1] > math[0] and math[3] == 0
    assert options[2] == np.log1p(2) and options[3] == 0
    assert questions[2] == np.log1p(1) and lines[0] == np.log1p(1)
    assert digits[1] > 0 and digits[3] == 0 and capitals[2] > 0


def test_featurizer_statistics_come_from_the_training_queries_only(split):
    train, test = split
    feats = LexicalFeaturizer().fit(train)
    x_train = feats.transform(train)
    assert x_train.shape[0] == len(train)
    unseen = RoutingData(query_ids=["u"], queries=["zyzzyva qwxq"], workers=train.workers, scores=np.zeros((1, 4)),
                         costs=np.zeros((1, 4)), embeddings=np.zeros((1, 8), dtype=np.float32))
    words = feats.word_.transform(unseen.queries)
    assert words.nnz == 0  # a word never seen in training has no column
    # the same query gives the same row however it is batched (serving scores one request at a time)
    whole = feats.transform(test).toarray()
    one = feats.transform(test.subset(np.array([3]))).toarray()
    np.testing.assert_allclose(one[0], whole[3])
    # refitting on other queries changes the vocabulary: nothing is fixed in advance
    other = LexicalFeaturizer().fit(test.subset(np.arange(2)))
    assert set(other.word_.vocabulary_) != set(feats.word_.vocabulary_)
    with pytest.raises(RuntimeError):
        LexicalFeaturizer().transform(test)
    with pytest.raises(ValueError):
        LexicalFeaturizer().fit(unseen)


def test_sparse_neighbour_search_matches_knn_on_the_same_vectors(split):
    train, test = split
    lexical = LexicalKNNRouter(k=7).fit(train)
    dense = KNNRouter(k=7)
    dense.unit_train_ = lexical.unit_train_.toarray().astype(np.float32)
    probe = lexical._unit(test.queries)
    np.testing.assert_array_equal(lexical.top_k(probe, 7), dense.top_k(probe.toarray().astype(np.float32), 7))
    # and the prediction is the neighbours' mean score
    similarity = (probe @ lexical.unit_train_.T).toarray()
    expected = train.scores[np.argsort(-similarity, axis=1, kind="stable")[:, :7]].mean(axis=1)
    np.testing.assert_allclose(lexical.predict_quality(test), expected)


def test_knn_lexical_tunes_k_on_the_training_queries(split):
    train, _ = split
    router = LexicalKNNRouter(k_grid=(3, 9, 27)).fit(train)
    assert router.k_ in (3, 9, 27)


def test_bad_input_is_rejected(split):
    train, test = split
    with pytest.raises(ValueError):
        LexicalLogisticRouter(C=0)
    with pytest.raises(RuntimeError):
        LexicalLogisticRouter().predict_quality(test)
    with pytest.raises(RuntimeError):
        LexicalKNNRouter().predict_quality(test)
    with pytest.raises(ValueError):
        LexicalKNNRouter().fit(train.subset(np.array([0])))


def test_registry_names_and_the_lexical_ensemble_is_its_members_mean(split):
    train, test = split
    assert registry.ENSEMBLES["lexical_ensemble"] == ("knn", "lexical", "knn_lexical")
    ensemble = registry.make_router("lexical_ensemble", 0).fit(train).predict_quality(test)
    members = [registry.make_router(m, 0).fit(train).predict_quality(test) for m in registry.ENSEMBLES["lexical_ensemble"]]
    np.testing.assert_allclose(ensemble, np.mean(members, axis=0))
    stack = registry.make_router("stacked_lexical", 0)
    assert stack.members == registry.ENSEMBLES["lexical_ensemble"]
    quality = stack.fit(train).predict_quality(test)
    assert roc_auc_score(test.scores[:, 0], quality[:, 0]) >= 0.95


@pytest.mark.parametrize("name", ["lexical", "knn_lexical"])
def test_lexical_routers_register_and_serve_the_same_decisions(name, split, tmp_path):
    train, test = split
    router = registry.make_router(name, 0).fit(train)
    served = ServedRouter.from_fitted(router, train, "test-book", embedding=None)
    loaded = ServedRouter.load(served.save(tmp_path / name))
    np.testing.assert_array_equal(loaded.quality(test), served.quality(test))
    np.testing.assert_allclose(served.quality(test), router.predict_quality(test))


def test_lexical_routers_run_through_the_replay_harness(split):
    """The harness cross-fits by name and averages an ensemble's members' own predictions."""
    train, test = split
    names = ["knn", "lexical", "knn_lexical", "lexical_ensemble"]
    board = run_replay_benchmark(test, None, names, seeds=(0,), n_boot=0, progress=False, train=train, n_jobs=1,
                                 include_singles=True).set_index("router")
    for name in names:
        assert np.isfinite(board.loc[name, "aiq"]), name
    assert board.loc["lexical", "best_accuracy"] >= 0.95  # the words tell who is right
