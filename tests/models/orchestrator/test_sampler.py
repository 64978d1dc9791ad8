"""The RL stage's fast sampler (models/orchestrator/sampler.py) against the trainer and LMController.

Tolerance of the log-prob agreement: 1e-3 nats per token. The sampler and the trainer run the same
float32 weights; they differ in how (merged W + (α/r)·BA vs. the factored LoRA path, cached vs. full
attention, left vs. right padding), which moves log-probs by float32 rounding: ~3e-5 observed on
SmolLM2-135M. 1e-3 leaves 30× room for other CPUs' kernels and still keeps every ratio
π_θ/π_old at the first update within e^±0.001, 200 times inside PPO's clip ε = 0.2 (004 eq. 7), so
the clipped objective sees the distribution the tokens were drawn from."""

from __future__ import annotations

import pytest
import torch

from models.orchestrator.config import GenerationSettings
from models.orchestrator.lm import LMController
from models.orchestrator.rl import RLSettings, RLTrainer, RolloutBatch
from models.orchestrator.engines import controller_for
from models.orchestrator.sampler import FastSampler, common_prefix

pytestmark = pytest.mark.slow

TOLERANCE = 1e-3
SYSTEM = "You route tasks. Reply with XML only: <final_answer>ANSWER</final_answer>, or a <plan> with <route>s."
QUESTIONS = ["What is 17 + 25?", "Compute 123 * 456, then add 7.", "What is the gcd of 84 and 36?"]


def prompts() -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]


def randomise_adapter(trainer: RLTrainer, seed: int, scale: float = 0.02) -> None:
    """LoRA's B starts at 0 (the adapter a no-op); a random B makes the policy differ from the base."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name and ".default." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


@pytest.fixture(scope="module")
def trainer(smollm2_folder) -> RLTrainer:
    trainer = RLTrainer.create(RLSettings(), smollm2_folder)
    randomise_adapter(trainer, 0)
    return trainer


def trainer_logprobs(trainer: RLTrainer, conversations, turns) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(trainer's log-probs, sampler's log-probs, positions where the re-tokenised ids are the generated ones)."""
    full = [c + [{"role": "assistant", "content": t.text}] for c, t in zip(conversations, turns)]
    batch = RolloutBatch.from_conversations(trainer.tokenizer, full, [[1.0]] * len(full), turns=[[t] for t in turns])
    return trainer.logprobs(batch), batch.old_logprobs, batch.old_known


def test_sampled_log_probs_agree_with_the_trainers_on_the_same_tokens(trainer):
    sampler = FastSampler(trainer.model, trainer.tokenizer, GenerationSettings(temperature=1.0, max_new_tokens=24))
    conversations = prompts() + prompts()[:1] * 2  # rows of one task (a group) beside other tasks
    turns = sampler.respond(conversations)
    assert len({t.completion_tokens for t in turns}) > 1, "rows should stop at different lengths"
    mine, theirs, known = trainer_logprobs(trainer, conversations, turns)
    assert int(known.sum()) >= 0.8 * sum(t.completion_tokens for t in turns)
    assert float((mine - theirs).abs()[known].max()) < TOLERANCE


def test_greedy_turns_are_the_transformers_controllers(trainer):
    settings = GenerationSettings(temperature=0.0, max_new_tokens=20)
    fast = FastSampler(trainer.model, trainer.tokenizer, settings).respond(prompts())
    reference = LMController(trainer.model, trainer.tokenizer, settings).respond(prompts())
    assert [t.token_ids for t in fast] == [t.token_ids for t in reference]
    for a, b in zip(fast, reference):
        assert max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs)) < TOLERANCE


def test_a_stored_prefix_changes_no_token(trainer):
    settings = GenerationSettings(temperature=1.0, max_new_tokens=16, seed=3)
    cold = FastSampler(trainer.model, trainer.tokenizer, settings)
    first = cold.respond(prompts())
    assert cold.prefixes, "the shared system prompt should be stored"
    cold.calls = 0  # same seed again, now through the stored prefix
    again = cold.respond(prompts())
    assert [t.token_ids for t in again] == [t.token_ids for t in first]
    for a, b in zip(first, again):
        assert max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs)) < 1e-4


def test_sync_follows_the_policy_after_an_update(smollm2_folder):
    trainer = RLTrainer.create(RLSettings(), smollm2_folder)
    randomise_adapter(trainer, 1)
    sampler = controller_for(trainer.model, trainer.tokenizer, GenerationSettings(temperature=1.0, max_new_tokens=12))
    assert isinstance(sampler, FastSampler)
    randomise_adapter(trainer, 2, scale=0.05)  # "an update" the engine has not seen
    turns = sampler.respond(prompts())
    mine, theirs, known = trainer_logprobs(trainer, prompts(), turns)
    assert float((mine - theirs).abs()[known].max()) > 10 * TOLERANCE, "stale weights should show"
    sampler.sync()
    turns = sampler.respond(prompts())
    mine, theirs, known = trainer_logprobs(trainer, prompts(), turns)
    assert float((mine - theirs).abs()[known].max()) < TOLERANCE


def test_the_reference_context_gives_the_base_models_weights(smollm2_folder):
    trainer = RLTrainer.create(RLSettings(), smollm2_folder)
    randomise_adapter(trainer, 4)
    sampler = FastSampler(trainer.model, trainer.tokenizer, GenerationSettings(temperature=0.0, max_new_tokens=4))
    policy_q = sampler.engine.model.layers[0].self_attn.q_proj.weight.clone()
    with trainer.model.disable_adapter():
        sampler.sync()
    base_q = trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(sampler.engine.model.layers[0].self_attn.q_proj.weight, base_q)
    assert not torch.equal(policy_q, base_q)


def test_common_prefix():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == [1, 2]
    assert common_prefix([[5, 6], [5, 6]]) == [5, 6]
    assert common_prefix([[1], [2]]) == []


def test_only_the_top_layers_train_when_asked(smollm2_folder, tokenizer):
    trainer = RLTrainer.create(RLSettings(trainable_layers=2, learning_rate=1e-2), smollm2_folder)
    total = trainer.model.get_base_model().config.num_hidden_layers
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(f"layers.{total - 1}." in n or f"layers.{total - 2}." in n for n in trainable)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    right = prompts()[0] + [{"role": "assistant", "content": "<final_answer>42</final_answer>"}]
    wrong = prompts()[0] + [{"role": "assistant", "content": "<final_answer>43</final_answer>"}]
    batch = RolloutBatch.from_conversations(trainer.tokenizer, [right, wrong], [[1.0], [-1.0]])
    stats = trainer.step(batch)
    assert torch.isfinite(torch.tensor(stats["loss"]))
    changed = {n for n, p in trainer.model.named_parameters() if "lora_" in n and not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    # The reference pass (set_adapter) must not unfreeze the lower layers.
    assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == trainable
