"""experiments/llama_engine_precision.py end to end on the real SmolLM2, f32 only, one small timed call: the
record has its fields and the float32 engine agrees with the trainer (the bound of
tests/models/orchestrator/test_llama_sampler.py); no timing is asserted."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_float32_engine_agrees_with_the_trainer_and_is_recorded(bench, tmp_path):
    out = tmp_path / "precision.json"
    # The timed part small (one call of 2 × 16 tokens, one thread): the agreement is what is checked.
    assert bench.main(["--weights", "f32", "--calls", "1", "--threads", "1", "--group", "2", "--tokens", "16",
                       "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    f32 = record["results"]["f32"]
    assert f32["tokens"] > 50 and f32["max_abs_diff"] < 1e-3
    assert f32["tokens_per_second"] > 0 and len(f32["seconds"]) == 1
    assert record["group_size"] == 2 and record["completion_tokens"] == 16
