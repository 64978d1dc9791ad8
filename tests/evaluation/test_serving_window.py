"""A served router reads the same tokens of a query its training vectors were computed from: the
bundle records the shared encoder's window (models.embeddings.DEFAULT_MAX_SEQ), and bundles written
before the field existed keep the model's own 256."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from evaluation.serving.single_turn import (META_FILE, EmbeddingRef, ServedRouter, bundled_minilm_ref, load_bundle,
                                            save_bundle)
from models.embeddings import DEFAULT_MAX_SEQ

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
try:  # the registry tests' synthetic logged outcomes and text-only router
    from test_registry import BOOK, routing_data, surface_router
finally:
    sys.path.pop(0)

SHARED_START = "Background: " + " ".join(f"fact {i} is about the number {i * 7}." for i in range(16))


def test_a_new_bundle_records_the_training_window_and_an_old_one_keeps_256(tmp_path):
    train = routing_data(60, seed=3)
    served = ServedRouter.from_fitted(surface_router().fit(train), train, BOOK.version, family="surface")
    directory = save_bundle(served.bundle, tmp_path / "new")
    assert load_bundle(directory).embedding.max_seq_length == DEFAULT_MAX_SEQ

    meta_path = directory / META_FILE
    meta = json.loads(meta_path.read_text())
    del meta["embedding"]["max_seq_length"]  # as written before the field existed
    meta_path.write_text(json.dumps(meta))
    assert load_bundle(directory).embedding.max_seq_length is None


def test_the_served_encoder_cuts_a_query_at_the_recorded_window():
    """Two queries that agree on their first ~200 tokens and differ after: one vector at a 128-token
    window (what the routers were trained on), two at the model's own 256."""
    queries = [SHARED_START + " Question: what is 3 + 4?", SHARED_START + " Question: name a city in Peru."]
    served = bundled_minilm_ref().load().encode(queries)
    assert bundled_minilm_ref().max_seq_length == 128
    np.testing.assert_allclose(served[0], served[1], atol=1e-6)
    own_window = EmbeddingRef().load().encode(queries)
    assert float(own_window[0] @ own_window[1]) < 0.9999
