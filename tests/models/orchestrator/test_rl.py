"""The RL update (models/orchestrator/rl.py): the clipped objective and k3 KL on hand-computed tensors,
the rollout batch's mask and per-turn advantages on real SmolLM2 tokens, a few real LoRA steps on
SmolLM2 that raise a positively advantaged conversation's log-probs, and resumable checkpoints."""

from __future__ import annotations

import math
import time

import pytest
import torch

from models.orchestrator.config import LLAMA_LINEAR_MODULES
from models.orchestrator.rl import (REFERENCE_ADAPTER, RLConfig, RLSettings, RLTrainer, RolloutBatch,
                                    policy_loss, rl_config, sequence_logprobs)
from models.orchestrator.sft_data import tokenize_conversation
from routerops.errors import InputError, RouteropsError
from routerops.orchestra.controller import ControllerTurn

EPS, BETA = 0.2, 0.1  # β larger than the paper's 1e-3 so the KL term shows in the sums


def loss_of(new, old, ref, adv, mask=None, beta=BETA):
    new = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    mask = t([1.0] * len(new) if mask is None else mask)
    loss, stats = policy_loss(new, t(old), t(ref), t(adv), mask, EPS, beta)
    loss.backward()
    return loss.item(), stats, new.grad


L = math.log


# ---- the objective on hand-computed tensors -------------------------------------------------------

def test_unclipped_tokens_give_minus_ratio_times_advantage():
    # ρ = 0.55/0.5 = 1.1 ∈ [0.8, 1.2], Â = 2: min(1.1·2, clip(1.1)·2) = 2.2.
    # ρ = 0.45/0.5 = 0.9, Â = −1: min(−0.9, −0.9) = −0.9.
    # Mean over the 2 tokens: −(2.2 − 0.9)/2 = −0.65. ref = new: k3 = e⁰ − 0 − 1 = 0.
    loss, stats, grad = loss_of(new=[L(0.55), L(0.45)], old=[L(0.5), L(0.5)], ref=[L(0.55), L(0.45)], adv=[2.0, -1.0])
    assert loss == pytest.approx(-0.65)
    assert stats["kl"] == 0 and stats["clip_fraction"] == 0
    assert stats["ratio"] == pytest.approx((1.1 + 0.9) / 2) and stats["advantage"] == pytest.approx(0.5)
    # d/d log π_θ of −ρ·Â/N is −ρ·Â/N: −1.1·2/2 = −1.1 and −0.9·(−1)/2 = +0.45 (the KL term's
    # gradient, β·(1 − e^{ref−new})/N, is 0 at ref = new).
    assert grad.tolist() == pytest.approx([-1.1, 0.45])


def test_a_positive_advantage_is_clipped_above_one_plus_epsilon():
    # ρ = 1.5 > 1.2 with Â = +1: min(1.5, 1.2) = 1.2, constant in θ, so no gradient (the clip removed it).
    # ρ = 0.5 < 0.8 with Â = +1: min(0.5, 0.8) = 0.5, the unclipped term; gradient −ρ·Â/N = −0.5/2 = −0.25.
    # Loss −(1.2 + 0.5)/2 = −0.85; one of the two tokens was clipped.
    loss, stats, grad = loss_of(new=[L(0.75), L(0.25)], old=[L(0.5), L(0.5)], ref=[L(0.75), L(0.25)], adv=[1.0, 1.0])
    assert loss == pytest.approx(-0.85)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    assert grad.tolist() == pytest.approx([0.0, -0.25])


def test_a_negative_advantage_is_clipped_below_one_minus_epsilon():
    # ρ = 0.5 < 0.8 with Â = −1: min(−0.5, −0.8) = −0.8, constant: no gradient.
    # ρ = 1.5 > 1.2 with Â = −1: min(−1.5, −1.2) = −1.5, the unclipped (pessimistic) term; gradient
    # −ρ·Â/N = 1.5/2 = 0.75. Loss −(−0.8 − 1.5)/2 = 1.15.
    loss, stats, grad = loss_of(new=[L(0.25), L(0.75)], old=[L(0.5), L(0.5)], ref=[L(0.25), L(0.75)], adv=[-1.0, -1.0])
    assert loss == pytest.approx(1.15)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    assert grad.tolist() == pytest.approx([0.0, 0.75])


def test_k3_kl_is_zero_at_the_reference_and_positive_away_from_it():
    # ρ = 1 and Â = 0: only the KL term. ref − new = ln 2: k3 = 2 − ln 2 − 1 = 0.30685;
    # ref − new = −ln 2: k3 = 0.5 + ln 2 − 1 = 0.19315. Mean 0.25, times β = 0.1: 0.025.
    loss, stats, grad = loss_of(new=[L(0.2), L(0.4)], old=[L(0.2), L(0.4)], ref=[L(0.4), L(0.2)], adv=[0.0, 0.0])
    assert stats["kl"] == pytest.approx((1 - L(2) + L(2) - 0.5) / 2)
    assert loss == pytest.approx(BETA * 0.25) and stats["loss_kl"] == pytest.approx(BETA * 0.25)
    # d k3 / d new = 1 − e^{ref−new}: 1 − 2 = −1 and 1 − 0.5 = 0.5; times β/N = 0.05.
    assert grad.tolist() == pytest.approx([-0.05, 0.025])
    _, same, _ = loss_of(new=[L(0.2)], old=[L(0.3)], ref=[L(0.2)], adv=[1.0])
    assert same["kl"] == 0


def test_masked_tokens_contribute_nothing_whatever_they_hold():
    base = loss_of(new=[L(0.55)], old=[L(0.5)], ref=[L(0.6)], adv=[2.0])
    nan = float("nan")
    masked = loss_of(new=[L(0.55), 40.0, -30.0], old=[L(0.5), -40.0, nan], ref=[L(0.6), nan, float("inf")],
                     adv=[2.0, 1e6, nan], mask=[1, 0, 0])
    assert masked[0] == pytest.approx(base[0])
    assert masked[1]["tokens"] == 1 and masked[1]["kl"] == pytest.approx(base[1]["kl"])
    assert masked[2].tolist() == pytest.approx(base[2].tolist() + [0.0, 0.0])


def test_the_loss_averages_over_the_groups_tokens_not_per_sequence():
    # Row 0: one token with Â = 3; row 1: three tokens with Â = 1 (ρ = 1 throughout). Token mean:
    # −(3 + 1 + 1 + 1)/4 = −1.5; a per-sequence mean would give −(3 + 1)/2 = −2.
    zeros = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    adv = torch.tensor([[3.0, 0, 0], [1, 1, 1]])
    loss, stats = policy_loss(zeros, zeros, zeros, adv, mask, EPS, BETA)
    assert loss.item() == pytest.approx(-1.5) and stats["tokens"] == 4


def test_policy_loss_refuses_an_empty_mask_and_mismatched_shapes():
    z = torch.zeros(3)
    with pytest.raises(ValueError, match="no controller token"):
        policy_loss(z, z, z, z, z)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(z, z, z, z, torch.zeros(2))


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token logits depend on the current token only: logits[ℓ] = W[x_ℓ]."""

    def __init__(self, vocab=7):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, attention_mask, use_cache, logits_to_keep):
        return type("Out", (), {"logits": self.table[input_ids][:, -logits_to_keep:]})()


def test_sequence_logprobs_score_each_masked_token_from_the_position_before_it():
    model = BigramLM()
    ids = torch.tensor([[1, 2, 3, 4, 0], [5, 6, 1, 2, 3]])
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
    batch = type("Batch", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": mask})()
    for temperature in (1.0, 0.7):
        got = sequence_logprobs(model, batch, temperature)
        expected = torch.zeros(2, 5)
        for b, l in mask.nonzero().tolist():
            expected[b, l] = torch.log_softmax(model.table[ids[b, l - 1]] / temperature, -1)[ids[b, l]]
        assert torch.allclose(got, expected, atol=1e-6)
    got.sum().backward()  # differentiable: the masked positions reach the weights
    assert model.table.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="position 0"):
        sequence_logprobs(model, type("Batch", (), {"input_ids": ids, "attention_mask": ids, "mask": 1 - mask})())


def test_sequence_logprobs_of_a_real_causal_lm_equal_its_full_forward_pass_and_gradient():
    """The head-on-masked-positions path (a transformers Llama, PEFT LoRA active) gives the log-probs and
    the LoRA gradient of log_softmax(model(ids).logits) read at the masked tokens."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                                init_lora_weights=False))
    ids = torch.randint(1, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(ids)
    attention[2, 9:] = 0  # a right-padded row
    mask = torch.zeros_like(ids)
    mask[0, 3:6] = 1
    mask[0, 9:11] = 1  # two turns with an observation between them
    mask[1, 1:12] = 1
    mask[2, 5:9] = 1
    batch = type("Batch", (), {"input_ids": ids, "attention_mask": attention, "mask": mask})()
    got = sequence_logprobs(model, batch, 0.7)
    got.sum().backward()
    fast_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    full = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits[:, :-1] / 0.7, -1)
    expected = torch.zeros(3, 12)
    expected[:, 1:] = full.gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    expected.sum().backward()
    assert torch.allclose(got, expected, atol=1e-5)
    for fast, slow in zip(fast_grads, [p.grad for p in model.parameters() if p.requires_grad]):
        assert torch.allclose(fast, slow, atol=1e-5, rtol=1e-4)


def tiny_lora_llama(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                               init_lora_weights=False))


def logprobs_and_grads(model, batch, shared: bool, monkeypatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    import models.orchestrator.rl as rl

    monkeypatch.setattr(rl, "MIN_SHARED_PREFIX", 1 if shared else 10**9)
    model.zero_grad()
    got = sequence_logprobs(model, batch, 0.7)
    (got * torch.linspace(-1, 1, got.numel()).reshape(got.shape)).sum().backward()  # rows weighted unlike
    return got.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def test_a_groups_common_prefix_run_once_gives_the_log_probs_and_gradient_of_every_row_run_whole(monkeypatch):
    """decoder_hidden_states: a prefix common to every row (system prompt, task, and here a first turn
    with a masked token inside it), run as a batch of one and its keys/values repeated, then rows of
    different lengths (one right-padded) on top: the same log-probs and LoRA gradient as the plain pass."""
    from models.orchestrator.rl import shared_prefix_length

    model = tiny_lora_llama()
    generator = torch.Generator().manual_seed(2)
    prefix = torch.randint(1, 97, (1, 20), generator=generator).repeat(3, 1)
    ids = torch.cat([prefix, torch.randint(1, 97, (3, 14), generator=generator)], dim=1)
    attention = torch.ones_like(ids)
    attention[2, 28:] = 0
    mask = torch.zeros_like(ids)
    mask[:, 15:18] = 1  # controller tokens inside the shared prefix: read from its one row
    mask[0, 22:30] = 1
    mask[1, 20:34] = 1
    mask[2, 24:28] = 1
    batch = type("Batch", (), {"input_ids": ids, "attention_mask": attention, "mask": mask})()
    assert shared_prefix_length(batch) == 20
    whole, whole_grads = logprobs_and_grads(model, batch, shared=False, monkeypatch=monkeypatch)
    once, once_grads = logprobs_and_grads(model, batch, shared=True, monkeypatch=monkeypatch)
    assert torch.allclose(once, whole, atol=1e-5)
    for a, b in zip(once_grads, whole_grads):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    padded_first = type("Batch", (), {"input_ids": ids, "attention_mask": attention.flip(1), "mask": mask})()
    assert shared_prefix_length(padded_first) == 0  # padding is never a shared prefix


# ---- truncated importance weights of the sampler's drift -------------------------------------------

def test_token_weights_scale_each_tokens_surrogate_and_leave_the_kl_alone():
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    new = torch.tensor([L(0.5), L(0.2)], dtype=torch.float64, requires_grad=True)
    old, ref, adv, mask = t([L(0.5), L(0.25)]), t([L(0.4), L(0.2)]), t([1.0, -2.0]), t([1.0, 1.0])
    weights = t([0.5, 2.0])
    loss, stats = policy_loss(new, old, ref, adv, mask, EPS, BETA, weights)
    # ρ = (1, 0.8): token 0 unclipped, 0.5·1·1; token 1 with Â < 0 takes min(0.8·−2, 0.8·−2) = −1.6, ×2
    k3 = sum(math.exp(r - n) - (r - n) - 1 for r, n in ((L(0.4), L(0.5)), (L(0.2), L(0.2))))
    assert loss.item() == pytest.approx(-(0.5 * 1.0 + 2.0 * -1.6) / 2 + BETA * k3 / 2)
    assert stats["loss_policy"] == pytest.approx(-(0.5 - 3.2) / 2)
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(new, old, ref, adv, mask, EPS, BETA, t([1.0]))


def correction_of(tis_cap: float, sampler, known, old):
    trainer = object.__new__(RLTrainer)  # sampler_correction reads the settings alone
    trainer.settings = RLSettings(tis_cap=tis_cap)
    batch = type("Batch", (), {"sampler_logprobs": torch.tensor([sampler]), "sampler_known": torch.tensor([known]),
                               "mask": torch.tensor([[1, 1, 1, 0]])})()
    return trainer.sampler_correction(batch, torch.tensor([old]))


def test_the_sampler_correction_is_min_of_the_ratio_and_the_cap_where_the_sampler_is_known():
    old = [L(0.5), L(0.1), L(0.3), L(0.9)]
    sampler = [L(0.4), L(0.01), L(0.3), L(0.1)]  # token 1: the sampler gave 10× less; token 3 is not trained
    weights, stats = correction_of(2.0, sampler, [True, True, False, True], old)
    assert weights[0].tolist() == pytest.approx([0.5 / 0.4, 2.0, 1.0, 1.0])  # capped; unknown → 1
    assert stats["tis_weight"] == pytest.approx((1.25 + 2.0) / 2)
    assert stats["sampler_tokens"] == 2
    assert stats["sampler_drift_max"] == pytest.approx(L(10))
    assert stats["sampler_drift"] == pytest.approx((L(0.5 / 0.4) + L(10)) / 2)
    off, drift = correction_of(0.0, sampler, [True, True, False, True], old)
    assert off is None and drift["sampler_drift_max"] == pytest.approx(L(10)) and "tis_weight" not in drift
    assert correction_of(2.0, sampler, [False, False, False, True], old) == (None, {})


# ---- the batch on real tokens --------------------------------------------------------------------

def assistant_texts(messages):
    return [m["content"] for m in messages if m["role"] == "assistant"]


def generated_turn(tokenizer, content, logprob=-0.5, stop=True):
    """A ControllerTurn as LMController returns it: the content's ids, then <|im_end|> when it stopped."""
    ids = tokenizer(content, add_special_tokens=False)["input_ids"]
    ids = ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")] if stop else ids
    return ControllerTurn(text=content, token_ids=tuple(ids), token_logprobs=tuple([logprob] * len(ids)))


def test_the_batch_masks_exactly_the_assistant_turns_and_carries_each_turns_advantage(tokenizer, conversations):
    chosen = [conversations[0], conversations[2]]  # one turn; two turns around an <obs>
    advantages = [[0.5], [1.0, -2.0]]
    batch = RolloutBatch.from_conversations(tokenizer, chosen, advantages)
    assert batch.input_ids.shape[0] == 2 and not batch.old_known.any() and batch.ref_logprobs is None
    for row, messages in enumerate(chosen):
        tokenized = tokenize_conversation(tokenizer, messages)
        n = len(tokenized.input_ids)
        assert batch.input_ids[row, :n].tolist() == tokenized.input_ids
        assert batch.mask[row, :n].tolist() == tokenized.assistant_masks  # SFT's mask, as §4.2 requires
        assert batch.attention_mask[row].tolist() == [1] * n + [0] * (batch.input_ids.shape[1] - n)
        assert not batch.mask[row, n:].any() and not batch.advantages[row, n:].any()
        for k, (content, a) in enumerate(zip(assistant_texts(messages), advantages[row])):
            at = batch.turn_index[row] == k
            # The turn's tokens are its content and the end-of-turn token, nothing of the template around.
            assert tokenizer.decode(batch.input_ids[row][at]) == content + "<|im_end|>"
            assert batch.advantages[row][at].tolist() == [a] * int(at.sum())
        assert ((batch.turn_index[row] >= 0) == batch.mask[row].bool()).all()
        assert not batch.advantages[row][batch.mask[row] == 0].any()  # system, task and <obs> carry 0
    assert batch.controller_tokens == 14 + 49


def test_generated_log_probs_are_kept_only_where_the_ids_match(tokenizer, conversations):
    messages = conversations[2]
    first, second = assistant_texts(messages)
    # Turn 0 as generated; turn 1 spelled out character by character: the same text, other ids.
    spelled = [i for ch in second for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    spelled += [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    other = ControllerTurn(text=second, token_ids=tuple(spelled), token_logprobs=tuple([-0.1] * len(spelled)))
    batch = RolloutBatch.from_conversations(tokenizer, [messages], [[1.0, 1.0]],
                                            turns=[[generated_turn(tokenizer, first, -0.25), other]])
    turn0, turn1 = batch.turn_index[0] == 0, batch.turn_index[0] == 1
    assert batch.old_known[0][turn0].all() and (batch.old_logprobs[0][turn0] == -0.25).all()
    assert not batch.old_known[0][turn1].any()  # recomputed by RLTrainer.prepare
    assert not batch.prepared


def test_a_turn_cut_at_max_new_tokens_does_not_train_the_templates_end_token(tokenizer, conversations):
    messages = conversations[0]
    (content,) = assistant_texts(messages)
    full = RolloutBatch.from_conversations(tokenizer, [messages], [[1.0]])
    cut = RolloutBatch.from_conversations(tokenizer, [messages], [[1.0]],
                                          turns=[[generated_turn(tokenizer, content, stop=False)]])
    assert cut.controller_tokens == full.controller_tokens - 1
    last = int(full.mask[0].nonzero()[-1])
    assert tokenizer.decode(full.input_ids[0, last]) == "<|im_end|>"
    assert cut.mask[0, last] == 0 and cut.advantages[0, last] == 0
    assert cut.old_known[0].sum() == cut.controller_tokens


def test_the_batch_refuses_advantages_that_do_not_fit_the_turns(tokenizer, conversations):
    with pytest.raises(ValueError, match="conversation 0: the mask has 2 controller turns but there are 1"):
        RolloutBatch.from_conversations(tokenizer, [conversations[2]], [[1.0]])
    with pytest.raises(ValueError, match="1 conversations but 2 advantage arrays"):
        RolloutBatch.from_conversations(tokenizer, [conversations[0]], [[1.0], [2.0]])


def test_max_length_keeps_the_start_of_each_conversation(tokenizer, conversations):
    batch = RolloutBatch.from_conversations(tokenizer, [conversations[0], conversations[2]], [[1.0], [1.0, 2.0]],
                                            max_length=100)
    assert batch.input_ids.shape[1] == 100 and batch.truncated == 1
    assert batch.controller_tokens == 14 + int((batch.turn_index[1] == 0).sum())


# ---- config ---------------------------------------------------------------------------------------

def test_the_section_splits_between_the_update_and_the_estimator(tmp_path):
    config = rl_config({"estimator": "grpo", "group_size": 4, "clip_epsilon": 0.1, "lora_r": 4})
    assert (config.advantages.estimator, config.group_size) == ("grpo", 4)
    assert (config.settings.clip_epsilon, config.settings.lora_r) == (0.1, 4)
    default = RLConfig()
    # The paper's values (§5, App. A.2/A.8): ε = 0.2, β = 1e-3, G = 8.
    assert (default.settings.clip_epsilon, default.settings.kl_beta, default.group_size) == (0.2, 1e-3, 8)
    assert default.settings.lora_target_modules == LLAMA_LINEAR_MODULES
    params = tmp_path / "params.yaml"
    params.write_text("orchestra:\n  rl:\n    kl_beta: 0.01\n    rho: 0.5\n")
    from stages.orchestra.config import load_run

    loaded = load_run(params).rl  # the section is read once, by the run's loader
    assert (loaded.settings.kl_beta, loaded.advantages.rho, loaded.source) == (0.01, 0.5, str(params))
    params.write_text("orchestra: {}\n")
    assert load_run(params).rl == RLConfig(source=str(params))


@pytest.mark.parametrize("raw, key, problem", [
    ({"learnin_rate": 1e-5}, "learnin_rate", "unknown key"),
    ({"clip_epsilon": 1.5}, "clip_epsilon", r"not in \(0, 1\)"),
    ({"kl_beta": -1}, "kl_beta", "≥ 0"),
    ({"lora_r": "8"}, "lora_r", "expected int"),
    ({"temperature": 0}, "temperature", "> 0"),
    ({"device": "tpu"}, "device", "not one of"),
    ({"group_size": 1}, "group_size", "≥ 2"),  # AdvantageConfig's key, same section
    ({"estimator": "ppo"}, "estimator", "not one of"),
    ({"pool_size": -1}, "pool_size", "≥ 0"),
    ({"tis_cap": 0.5}, "tis_cap", "0 \\(off\\) or a finite cap ≥ 1"),
    ({"tis_cap": float("inf")}, "tis_cap", "finite cap"),
    ({"rollout_weights": "q8"}, "rollout_weights", "not one of"),
])
def test_bad_settings_name_the_key(raw, key, problem):
    with pytest.raises(InputError, match=f"params.yaml: field 'orchestra.rl.{key}': .*{problem}"):
        rl_config(raw, "params.yaml", "orchestra.rl")


def test_a_section_that_is_not_a_mapping_is_refused():
    with pytest.raises(InputError, match="orchestra.rl': expected a mapping"):
        rl_config([1, 2], "params.yaml", "orchestra.rl")


# ---- real steps on SmolLM2 ------------------------------------------------------------------------

SETTINGS = RLSettings(learning_rate=2e-3, lora_r=4, lora_alpha=8, lora_target_modules=("q_proj",), max_steps=5,
                      save_steps=3, seed=0)
ADVANTAGES = [[-1.0], [1.0, 1.0]]  # the two-turn conversation is the better rollout


@pytest.fixture
def chosen(conversations):
    """81 and 137 tokens: SmolLM2's template around two short grammar conversations of conftest.py."""
    return [conversations[0], conversations[2]]


@pytest.fixture
def rollout(tokenizer, chosen):
    return RolloutBatch.from_conversations(tokenizer, chosen, ADVANTAGES, max_length=200)


def row_logprobs(trainer, batch, reference=False):
    """Sum of the controller tokens' log-probs, per conversation."""
    return (trainer.logprobs(batch, reference) * batch.mask).sum(dim=1)


@pytest.mark.slow
def test_steps_raise_the_advantaged_conversation_and_resume_exactly(smollm2_folder, rollout, tmp_path):
    trainer = RLTrainer.create(SETTINGS, smollm2_folder)
    batch = trainer.prepare(rollout)
    assert batch.prepared
    before = row_logprobs(trainer, batch)
    assert torch.equal(before, row_logprobs(trainer, batch, reference=True))  # LoRA B = 0: policy = base
    with torch.no_grad():  # the plain computation: every position's log-softmax, then the masked tokens
        logits = trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    naive = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    assert torch.allclose((naive * batch.mask[:, 1:]).sum(dim=1), before, rtol=1e-4)
    started = time.perf_counter()
    metrics = [trainer.step(batch) for _ in range(3)]
    seconds = (time.perf_counter() - started) / 3
    print(f"\nRL step on SmolLM2 (2 conversations, {batch.controller_tokens} controller tokens of "
          f"{int(batch.attention_mask.sum())}): {seconds:.2f} s/step; metrics {metrics}")
    first = metrics[0]
    # Before the first update the policy is the reference and the old policy: KL 0, ratio 1, no clip.
    assert first["kl"] == pytest.approx(0, abs=1e-7) and first["ratio"] == pytest.approx(1, abs=1e-6)
    assert first["clip_fraction"] == 0 and first["loss"] == pytest.approx(-first["advantage"], abs=1e-6)
    assert all(m["kl"] >= 0 for m in metrics) and metrics[-1]["kl"] > 0
    after = row_logprobs(trainer, batch)
    assert after[1] > before[1] + 0.1  # Â > 0: its controller tokens became more likely
    assert after[0] < before[0]  # Â < 0: less likely
    assert row_logprobs(trainer, batch, reference=True).tolist() == before.tolist()  # the reference never moves

    assert trainer.checkpoint_due and not trainer.finished
    checkpoint = trainer.save(tmp_path / "checkpoint")
    trainer.save(checkpoint)  # overwriting a checkpoint is atomic too, and leaves nothing beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    expected = [trainer.step(batch)["loss"] for _ in range(2)]
    assert trainer.finished
    resumed = RLTrainer.resume(checkpoint, SETTINGS)
    assert resumed.step_count == 3
    # The same weights give the same next loss; the same AdamW moments give the same loss after it.
    assert [resumed.step(batch)["loss"] for _ in range(2)] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    with pytest.raises(RouteropsError, match="learning_rate differ"):
        RLTrainer.resume(checkpoint, RLSettings(**{**SETTINGS.__dict__, "learning_rate": 1e-4}))


@pytest.mark.slow
def test_an_sft_adapter_is_the_frozen_reference_and_the_policys_start(smollm2_folder, rollout, chosen, tmp_path):
    from peft import get_peft_model

    from models.orchestrator.lm import load_causal_lm
    from models.orchestrator.rl import lora_config

    # A stand-in SFT adapter: random, non-zero LoRA weights on q_proj.
    torch.manual_seed(1)
    sft = get_peft_model(load_causal_lm(smollm2_folder, "float32", "cpu"), lora_config(SETTINGS))
    with torch.no_grad():
        for name, p in sft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    sft.save_pretrained(tmp_path / "sft")
    del sft

    trainer = RLTrainer.create(SETTINGS, smollm2_folder, sft_adapter=tmp_path / "sft")
    assert all(REFERENCE_ADAPTER not in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert all(id(p) not in optimised for name, p in trainer.model.named_parameters() if REFERENCE_ADAPTER in name)
    with trainer.model.disable_adapter():
        base = row_logprobs(trainer, rollout)
    # Old log-probs given for the first conversation's turn are kept; the rest are recomputed.
    (answer,) = assistant_texts(chosen[0])
    given = RolloutBatch.from_conversations(trainer.tokenizer, chosen, ADVANTAGES, max_length=200,
                                            turns=[[generated_turn(trainer.tokenizer, answer, -3.0)], None])
    batch = trainer.prepare(given)
    current = trainer.logprobs(batch) * batch.mask
    start, reference = current.sum(dim=1), row_logprobs(trainer, batch, reference=True)
    assert torch.equal(start, reference) and not torch.allclose(start, base)  # both are the SFT adapter
    assert (batch.old_logprobs[0][batch.mask[0].bool()] == -3.0).all()
    assert torch.equal((batch.old_logprobs * batch.mask)[1], current[1])
    first = trainer.step(batch)
    assert first["kl"] == pytest.approx(0, abs=1e-7)
    trainer.step(batch)
    assert row_logprobs(trainer, batch, reference=True).tolist() == reference.tolist()
    assert row_logprobs(trainer, batch)[1] > start[1]
    trainer.save(tmp_path / "checkpoint")
    resumed = RLTrainer.resume(tmp_path / "checkpoint")
    assert resumed.sft_adapter == tmp_path / "sft" and resumed.step_count == 2
    assert row_logprobs(resumed, batch, reference=True).tolist() == reference.tolist()



@pytest.mark.slow
def test_a_step_on_an_unprepared_batch_is_the_step_on_the_prepared_one(smollm2_folder, rollout):
    # step() takes the old log-probs from its own forward pass instead of prepare()'s extra no-grad pass
    # (benchmarks/rl_step.py): the same weights, so the same loss, statistics and update.
    prepared, direct = RLTrainer.create(SETTINGS, smollm2_folder), RLTrainer.create(SETTINGS, smollm2_folder)
    expected = prepared.step(prepared.prepare(rollout))
    got = direct.step(rollout)
    assert {k: v for k, v in got.items() if k != "seconds"} == pytest.approx(
        {k: v for k, v in expected.items() if k != "seconds"}, rel=1e-6, abs=1e-9)
    assert got["ratio"] == 1 and got["kl"] == 0
    for (name, a), (_, b) in zip(prepared.model.named_parameters(), direct.model.named_parameters()):
        if a.requires_grad:
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-9), name


def recording_gradients(trainer) -> list:
    """The gradients each optimizer step sees (Adam's first step is ±lr wherever the gradient is not
    ~0, so the weights alone would hide float noise as sign flips of near-zero gradients)."""
    seen, step = [], trainer.optimizer.step

    def record(*args, **kwargs):
        seen.append([p.grad.detach().clone() for p in trainer.parameters])
        return step(*args, **kwargs)

    trainer.optimizer.step = record
    return seen


@pytest.mark.slow
def test_accumulated_minibatches_make_the_update_of_their_union(tokenizer, smollm2_folder, chosen):
    # step_accumulated weights each minibatch's token mean by its share of the tokens: one AdamW update
    # that follows the gradient of the whole batch's token mean (the critique/CoRL `tree.accumulate`).
    whole = RolloutBatch.from_conversations(tokenizer, chosen, ADVANTAGES, max_length=200)
    parts = [RolloutBatch.from_conversations(tokenizer, [c], [a], max_length=200) for c, a in zip(chosen, ADVANTAGES)]
    one, split = RLTrainer.create(SETTINGS, smollm2_folder), RLTrainer.create(SETTINGS, smollm2_folder)
    expected_grads, got_grads = recording_gradients(one), recording_gradients(split)
    expected = one.step(whole)
    got = split.step_accumulated(parts)
    assert got["step"] == 1 and got["tokens"] == expected["tokens"]
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-7)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-3)
    assert len(expected_grads) == len(got_grads) == 1  # one optimizer step each
    for a, b in zip(expected_grads[0], got_grads[0]):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4 * float(a.abs().max()) + 1e-12)  # padding: float noise
