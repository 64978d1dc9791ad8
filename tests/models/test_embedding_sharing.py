"""One replay run embeds each distinct query once, whatever the routers, folds and seeds: the
baselines' query vectors and MTRouter's φ read the same process-wide memo (models.embeddings). And a
batchable backend gives a text the same vector in a batch as alone, within BATCH_ATOL."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models import embeddings
from models.embeddings import BACKENDS, BATCH_ATOL, SentenceEncoder, shared_vectors
from routerops.pricing import Price, PriceBook


def tiny_table(n: int = 24) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        text = f"Question {i}: a shop sells {i + 3} apples at {i % 5 + 1} dollars each. How much in total?"
        for worker, p in (("weak", 0.4), ("strong", 0.8)):
            rows.append({"dataset": "t", "query_id": f"q{i}", "query": text, "worker": worker,
                         "score": float(rng.random() < p), "prompt_tokens": 40, "completion_tokens": 60})
    return pd.DataFrame(rows)


def book() -> PriceBook:
    import datetime as dt

    prices = {"weak": Price(0.6, 0.6, 0.6, 0.0), "strong": Price(10.0, 30.0, 10.0, 0.0)}
    return PriceBook(version="t", effective_date=dt.date(2024, 1, 1), prices=prices)


@pytest.fixture
def fresh_process_state(tmp_path, monkeypatch):
    """An empty cache directory and memo, and no encoder left over from another test."""
    from models import registry as baselines

    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path))
    shared_vectors().clear()
    embeddings._encoder_for.cache_clear()
    baselines.shared_history_encoder.cache_clear()
    yield
    shared_vectors().clear()
    embeddings._encoder_for.cache_clear()
    baselines.shared_history_encoder.cache_clear()


@pytest.mark.slow
def test_each_query_is_embedded_once_across_routers_folds_and_seeds(fresh_process_state):
    from models import registry as baselines
    from evaluation.replay import run_replay_benchmark

    table = tiny_table()
    run_replay_benchmark(table, book(), ["knn", "logistic", "mtrouter"], k=2, seeds=(0, 1), n_boot=0,
                         include_singles=False, progress=False)
    table_encoder = embeddings.default_encoder()
    mtrouter_sentence = baselines.shared_history_encoder().text_encoder.encoders[0]._sentence
    assert table_encoder.cache_id == mtrouter_sentence.cache_id  # same backend and length: one key space
    assert table_encoder.embedded == table["query_id"].nunique()
    assert mtrouter_sentence.embedded == 0  # every fold and seed of MTRouter read the shared vectors


@pytest.mark.slow
def test_a_text_gets_the_same_vector_in_a_batch_as_alone(tmp_path):
    assert BACKENDS["onnx"].batchable and not BACKENDS["onnx-int8"].batchable
    texts = ["ok", "A train leaves at 3 pm and travels 120 miles at 40 miles per hour. When does it arrive? " * 5,
             "What is 2 + 2?"]
    encoder = SentenceEncoder(cache_dir=tmp_path, use_cache=False, backend="onnx", max_seq_length=512)
    batched = encoder.encode(texts)
    shared_vectors().clear()  # else the memo would hand back the batched vectors
    alone = np.stack([encoder.encode([t])[0] for t in texts])
    shared_vectors().clear()
    assert np.abs(batched - alone).max() <= BATCH_ATOL
    assert encoder.embedded == 2 * len(texts)


def test_vectors_of_different_lengths_or_backends_never_share_a_key(tmp_path):
    ids = {SentenceEncoder(cache_dir=tmp_path, backend=b, max_seq_length=m).cache_id
           for b in ("torch", "onnx", "onnx-int8") for m in (None, 256, 512)}
    assert len(ids) == 9


def test_remembered_vectors_are_served_without_running_the_encoder(fresh_process_state, tmp_path):
    """What a replay worker process does first: the parent's vectors go into its memo, so MTRouter's
    φ there reads them instead of embedding the table again."""
    from models.embeddings import remember_vectors

    texts = ["first query", "second query"]
    encoder = SentenceEncoder(cache_dir=tmp_path, use_cache=False, backend="onnx-int8", max_seq_length=256)
    vectors = np.eye(2, 384, dtype=np.float32)
    remember_vectors(encoder.cache_id, texts, vectors)
    np.testing.assert_array_equal(encoder.encode(texts), vectors)
    assert encoder.embedded == 0


@pytest.mark.slow
def test_int8_bulk_vectors_are_bit_identical_to_one_query_serving(tmp_path):
    """The exact-vector guarantee MTRouter and the baselines rely on: a replay embeds a table through
    the bulk path (one text per call, several calls at once on single-threaded sessions), a served
    router embeds one query through the encoder's own multi-threaded session. Both must give the very
    same float32 vector, not one within a tolerance: routing compares those vectors' scores."""
    import torch

    texts = ["ok", "What is 2 + 2?",
             "A train leaves at 3 pm and travels 120 miles at 40 miles per hour. When does it arrive? " * 9,
             "Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four."]
    encoder = SentenceEncoder(cache_dir=tmp_path, use_cache=False, backend="onnx-int8", max_seq_length=256)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the bulk path runs where more than one thread is allowed
    try:
        model = encoder._load_onnx()
        bulk = model.encode(texts, encoder.batch_size)
    finally:
        torch.set_num_threads(threads)
    assert model._bulk_session is not None  # the parallel single-threaded path really ran
    served = np.concatenate([model.encode([t], 1) for t in texts])  # one query at a time, as serving
    np.testing.assert_array_equal(bulk, served)
