"""experiments/k_worker_lm_encoder.py: the vector cache computes each layer once."""

from __future__ import annotations

import numpy as np


def test_cached_vectors_compute_only_the_missing_layers(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "CACHE", tmp_path)
    calls = []
    real = bench.lm_query_vectors

    def counted(texts, layers, max_tokens):
        calls.append(list(layers))
        return real(texts, layers, max_tokens, batch=2, threads=1)

    monkeypatch.setattr(bench, "lm_query_vectors", counted)
    texts = ["Is 7 prime?", "Name a colour of the sky."]
    first = bench.cached_lm_vectors(texts, [1, 2], max_tokens=64)
    second = bench.cached_lm_vectors(texts, [2, 3], max_tokens=64)
    assert calls == [[1, 2], [3]]  # layer 2 came from the cache
    np.testing.assert_array_equal(first[2], second[2])
    assert not list(tmp_path.glob("*.partial*"))  # written beside the final name, then renamed
