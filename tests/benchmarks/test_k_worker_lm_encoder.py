"""benchmarks/k_worker_lm_encoder.py: a query's SmolLM2 vector depends on its own text alone."""

from __future__ import annotations

import numpy as np


def test_a_vector_is_the_same_alone_or_padded_in_a_batch(bench):
    texts = ["Is 7 prime?", "Write a function that reverses a list. " * 12, "What is the capital of France?"]
    together = bench.lm_query_vectors(texts, layers=[0, 30], batch=3, threads=1)
    alone = bench.lm_query_vectors(texts, layers=[0, 30], batch=1, threads=1)
    for layer in (0, 30):
        assert together[layer].shape == (3, 576) and np.isfinite(together[layer]).all()
        np.testing.assert_allclose(together[layer], alone[layer], rtol=1e-3, atol=1e-3)
    assert not np.allclose(together[30][0], together[30][2])  # different texts, different vectors


def test_the_window_truncates_long_queries(bench):
    head = "Which of these numbers is even: 3, 5, 8? "
    long = head + "Ignore this padding sentence. " * 40
    vectors = bench.lm_query_vectors([head, long], layers=[30], max_tokens=8, batch=1, threads=1)
    np.testing.assert_allclose(vectors[30][0], vectors[30][1], rtol=1e-4, atol=1e-4)  # both read 8 tokens


def test_standardised_uses_train_statistics_and_unit_norm(bench):
    rng = np.random.default_rng(0)
    train = rng.normal(size=(50, 6)) * np.array([1, 1, 1, 1, 1, 500.0])  # one huge dimension, as LMs have
    other = rng.normal(size=(10, 6))
    out = bench.standardised(train, np.vstack([train, other]))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    z = (train - train.mean(axis=0)) / (train.std(axis=0) + 1e-6)
    np.testing.assert_allclose(out[:50], z / np.linalg.norm(z, axis=1, keepdims=True), rtol=1e-5)


def test_dropping_the_blocks_above_the_layers_asked_for_changes_nothing(bench):
    texts = ["Is 7 prime?", "Name a colour of the sky."]
    shallow = bench.lm_query_vectors(texts, layers=[2], batch=2, threads=1)  # runs three blocks
    full = bench.lm_query_vectors(texts, layers=[2, 30], batch=2, threads=1)  # runs all thirty
    np.testing.assert_allclose(shallow[2], full[2], rtol=1e-4, atol=1e-4)
