"""The policy-gradient core of the orchestrator's RL stage (paper 004, Uno-Orchestra, §4.2 and App. B):
one clipped-ratio update of the LM controller's LoRA adapter on a group of executed conversations,
with a low-variance KL penalty to a frozen reference, the loss on the controller's own tokens only
(004 §4.2 eq. 7; 003 CoRL §3.2 eq. 2 masks the expert LLMs' tokens the same way).

The objective, as `policy_loss` computes it over the N controller tokens of a batch (every position ℓ
where `mask` is 1; observation, system, task and chat-template tokens are 0):

    ρ_ℓ    = exp(log π_θ(x_ℓ|h_ℓ) − log π_old(x_ℓ|h_ℓ))           importance ratio (B.3; eq. 7)
    L_clip = −(1/N) Σ_ℓ min(ρ_ℓ·Â_t(ℓ), clip(ρ_ℓ, 1−ε, 1+ε)·Â_t(ℓ))  clipped surrogate (B.4; eq. 7)
    r_ℓ    = log π_ref(x_ℓ|h_ℓ) − log π_θ(x_ℓ|h_ℓ)
    k3_ℓ   = exp(r_ℓ) − r_ℓ − 1                                  eq. 7's "ρ − log ρ − 1", ρ = π_ref/π_θ
    L      = L_clip + β·(1/N) Σ_ℓ k3_ℓ                           ε = 0.2, β = 1e-3 (§5, App. A.2, A.8)

Â_{t(ℓ)} is the advantage of the turn that holds token ℓ (advantages.py: `turn_advantages`, spread
onto tokens by `masked_token_advantages`). Choices the paper leaves open are documented where they are
made: the averaging (`policy_loss`), which old log-probabilities (`RolloutBatch`), the reference
(`RLTrainer`), the learning rate for a LoRA adapter (`RLSettings`).

What comes from libraries, and what is written here:
- PEFT: the LoRA layers (`get_peft_model`, `LoraConfig`), loading an SFT adapter as the trainable
  starting point and again as a second, frozen named adapter on the same base weights
  (`PeftModel.from_pretrained`, `load_adapter`, `set_adapter`), the adapters-off context
  (`disable_adapter`) that makes the base model the reference, and adapter save/load.
- TRL: `selective_log_softmax`, the memory-lean log-softmax-and-gather of the token log-probs.
- torch: AdamW and gradient-norm clipping.
- this project: chat-template tokenisation with the assistant mask (sft_data.tokenize_conversation,
  the very mask SFT trains on, as §4.2 requires) and the turn advantages (advantages.py).
- here: the loss (TRL computes it inside GRPOTrainer's private `_compute_loss`, not as a function),
  the batch with per-turn advantages and old log-probs matched to the generated ids, and a small
  trainer with atomic, resumable checkpoints.

Why not TRL's GRPOTrainer: it owns generation and scoring. It samples completions itself (single-turn,
or its own tool-calling loop / the experimental `rollout_func`), computes one group-normalised
advantage per completion from reward functions, and spreads that one scalar over the completion. Our
rollouts come from routerops.orchestra's executor (priced workers, budgets, <obs> turns between the
controller's turns), and the advantages are per turn (MT-GRPO, Agentic-GRPO) or per tree node
(tree-GRPO), computed over the group after execution; feeding those through GRPOTrainer would mean
overriding its private generation and advantage code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.orchestrator.advantages import (AdvantageConfig, advantage_config,
                                            masked_token_advantages)
from models.orchestrator.config import DEVICES, DTYPES, LLAMA_LINEAR_MODULES, section_from_mapping
from models.orchestrator.lm import load_causal_lm, load_tokenizer, resolve_device, seeded
from models.orchestrator.sft_data import tokenize_conversation
from routerops.errors import InputError, RouteropsError
from routerops.orchestra.controller import ControllerTurn, Message

log = logging.getLogger(__name__)

POLICY_ADAPTER = "default"  # PEFT saves the adapter named "default" at the folder's top level
REFERENCE_ADAPTER = "reference"  # the frozen SFT adapter, when the reference is one
STATE_FILE = "rl_state.json"
OPTIMIZER_FILE = "optimizer.pt"
ADAPTER_DIR = "adapter"
RL_POOLS = ("signal", "curriculum")
ROLLOUT_WEIGHTS = ("f32", "f16")  # the llama.cpp engine's base weights (models/orchestrator/llama_engine.py WEIGHTS)


# ---------------------------------------------------------------------------------------------------
# Settings: orchestra.rl holds both these keys and AdvantageConfig's


@dataclass(frozen=True)
class RLSettings:
    """The update's settings (`orchestra.rl`, beside advantages.AdvantageConfig's estimator keys).

    The group size G is AdvantageConfig.group_size (`orchestra.rl.group_size`, 8 by §5 and App. A.2):
    one key, one owner, read as `RLConfig.group_size`. The paper's values are cited; where a value is
    the CPU demo's, the paper's is given beside it."""

    # App. A.2/A.8: AdamW at 1e-6, for full fine-tuning of Qwen2.5-7B. A LoRA adapter needs a larger
    # rate; we scale the paper's by the factor the demo's SFT already applies to the paper's SFT rate
    # (5e-4 vs App. A.2's 2e-5, 25×): 2.5e-5.
    learning_rate: float = 2.5e-5
    clip_epsilon: float = 0.2  # PPO clip ε: §5, App. A.2 and A.8
    kl_beta: float = 1e-3  # β of the KL to the frozen reference: §5, App. A.2 and A.8 ("no entropy bonus")
    # The rollouts' sampling temperature (orchestra.controller.temperature at rollout time). Policy, old
    # and reference log-probs are all taken from logits / T, so the ratio compares the distribution the
    # tokens were drawn from (as TRL's GRPOTrainer does). The paper gives none. > 0: greedy rollouts of
    # one task are identical and leave nothing to compare.
    temperature: float = 1.0
    # tree_grpo's rollout geometry (routerops/orchestra/executor.py TreeShape; 004 App. B gives none):
    # G / tree_branches roots, each running one split into tree_branches siblings before controller
    # turn tree_branch_turn. Turn 1 is the first turn after a plan's observations: siblings share the
    # plan and its worker results and differ in what they make of them.
    tree_branches: int = 2
    tree_branch_turn: int = 1
    # Which train tasks RL visits. "signal": 004's D_RL as the residual hard pool, probed — every train
    # task is rolled out probe_samples times by the SFT policy at `temperature` before the first step,
    # and only tasks solved sometimes but not always (0 < success < 1) are kept: a group whose G
    # rollouts all succeed or all fail has zero group-relative advantage (B.2) and teaches nothing.
    # "curriculum": the filter's D_RL then D_SFT's tasks, unprobed (the stage before this option).
    pool: str = "signal"
    probe_samples: int = 4  # rollouts per train task in the probe (G of §5 would be 8)
    # "signal" only: keep at most this many of the probed pool, those whose success is nearest ½ (ties:
    # the curriculum's order), so that max_steps meets each more than once; 0 keeps them all. Ours, a
    # demo setting: 16 steps over a 14-task pool meet no task twice, so the train curve follows the
    # pool's task families; over 8 tasks each is met twice and the second pass is read against the
    # first on the same tasks (rl_result.json: success_by_pass).
    pool_size: int = 0
    max_steps: int = 20  # optimisation steps of the demo (App. A.2: one pass over 2,976 tasks at G = 8)
    save_steps: int = 5  # checkpoint period (the paper gives none)
    # Tokens kept per conversation (its start). App. A.2: 4,096 prompt + 16,384 assistant tokens; the
    # demo keeps SFT's 1,024.
    max_seq_len: int = 1024
    weight_decay: float = 0.0  # the paper names AdamW without a decay; 0 as TRL's GRPOConfig
    max_grad_norm: float = 1.0  # the paper gives none; TRL's default
    # The LoRA adapter trained when no SFT adapter is given (an SFT adapter brings its own config); the
    # same keys and defaults as orchestra.sft. No lora_dropout: dropout is off throughout (TRL's
    # GRPOConfig.disable_dropout), else the ratio at the first update would compare two random masks.
    lora_r: int = 8
    lora_alpha: int = 16
    lora_target_modules: tuple[str, ...] = LLAMA_LINEAR_MODULES
    seed: int = 0  # the LoRA initialisation
    # 0: every layer's LoRA weights train (the paper's full update). k > 0: only the top k decoder
    # layers' do; the rest keep the SFT adapter's values. Backpropagation then stops at layer L − k, so
    # on a CPU the update costs a fraction of the full backward pass (benchmarks/rl_step.py measures it).
    # Ours, not the paper's: a CPU setting, said in the README where it is used.
    trainable_layers: int = 0
    # Truncated importance sampling of the sampler's drift (Yao et al. 2025, "Your efficient RL framework
    # secretly brings you off-policy RL training"; TRL's vllm_importance_sampling_correction in its
    # token_truncate mode). The ratio of eq. 7 compares the trainer's own π_θ and π_old, but the tokens
    # were drawn by the rollout engine, whose arithmetic differs (llama.cpp with float16 weights: ~1.5e-3
    # nats a token on average, experiments/llama_engine_precision.py). Each token's surrogate term is
    # weighted by min(π_old(x) / π_sampler(x), tis_cap), with the sampler's own log-prob where the turn
    # gives one for the trained token; 0 turns the weight off. Ours (004 samples with the policy it trains).
    tis_cap: float = 2.0
    # The rollout engine's base weights when orchestra.controller.engine is llama_cpp: "f32" (the
    # trainer's own, ~3e-5 nats from its log-probs) or "f16" (~1.4x the tokens/s on a CPU, ~1.5e-3 nats
    # a token on average; the drift tis_cap corrects). Evaluation always samples f32. Ours.
    rollout_weights: str = "f32"
    device: str = "cpu"  # cpu | cuda | auto; "cuda" on a machine without one is refused
    dtype: str = "float32"  # the base weights' dtype once loaded (orchestra.model.dtype)

    def validate(self, source: str, where: str = "rl") -> None:
        for name in ("learning_rate", "temperature", "max_steps", "save_steps", "max_seq_len", "lora_r",
                     "lora_alpha", "max_grad_norm"):
            if not getattr(self, name) > 0:  # NaN fails too
                raise InputError(source, f"{where}.{name}", f"{getattr(self, name)} must be > 0")
        if not 0 < self.clip_epsilon < 1:
            raise InputError(source, f"{where}.clip_epsilon", f"{self.clip_epsilon} is not in (0, 1)")
        for name in ("kl_beta", "weight_decay"):
            if not 0 <= getattr(self, name) < math.inf:
                raise InputError(source, f"{where}.{name}", f"{getattr(self, name)} must be finite and ≥ 0")
        if self.pool not in RL_POOLS:
            raise InputError(source, f"{where}.pool", f"{self.pool!r} is not one of {RL_POOLS}")
        if self.pool_size < 0:
            raise InputError(source, f"{where}.pool_size", f"{self.pool_size} must be ≥ 0 (0 = the whole probed pool)")
        if self.probe_samples < 2:
            raise InputError(source, f"{where}.probe_samples", "a success rate strictly between 0 and 1 needs ≥ 2 samples")
        if not (self.tis_cap == 0 or 1 <= self.tis_cap < math.inf):
            raise InputError(source, f"{where}.tis_cap", f"{self.tis_cap} must be 0 (off) or a finite cap ≥ 1")
        if self.rollout_weights not in ROLLOUT_WEIGHTS:
            raise InputError(source, f"{where}.rollout_weights", f"{self.rollout_weights!r} is not one of {ROLLOUT_WEIGHTS}")
        if self.trainable_layers < 0:
            raise InputError(source, f"{where}.trainable_layers", f"{self.trainable_layers} must be ≥ 0 (0 = all layers)")
        if not self.lora_target_modules:
            raise InputError(source, f"{where}.lora_target_modules", "name at least one module")
        if self.tree_branches < 2 or self.tree_branch_turn < 1:
            raise InputError(source, f"{where}.tree_branches", "a tree needs tree_branches ≥ 2 and tree_branch_turn ≥ 1")
        if self.device not in DEVICES:
            raise InputError(source, f"{where}.device", f"{self.device!r} is not one of {DEVICES}")
        if self.dtype not in DTYPES:
            raise InputError(source, f"{where}.dtype", f"{self.dtype!r} is not one of {DTYPES}")


ADVANTAGE_KEYS = frozenset(f.name for f in dataclasses.fields(AdvantageConfig))
SETTING_KEYS = frozenset(f.name for f in dataclasses.fields(RLSettings))
assert not ADVANTAGE_KEYS & SETTING_KEYS, "a key of orchestra.rl must have one owner"


@dataclass(frozen=True)
class RLConfig:
    """The whole `orchestra.rl` section: the update's settings and the advantage estimator's."""

    settings: RLSettings = field(default_factory=RLSettings)
    advantages: AdvantageConfig = field(default_factory=AdvantageConfig)
    source: str = ""  # the file it came from, for error messages

    @property
    def group_size(self) -> int:
        return self.advantages.group_size


def rl_config(raw: Mapping[str, Any] | None, source: str = "", where: str = "rl") -> RLConfig:
    """RLConfig from the RL mapping at `where` (the caller's section: "orchestra.rl") of file `source`.
    Estimator keys go to AdvantageConfig, the others to RLSettings; an unknown key, a wrong type or a
    value out of range raises InputError naming `<where>.<key>`."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise InputError(source, where, "expected a mapping")
    unknown = sorted(set(raw) - ADVANTAGE_KEYS - SETTING_KEYS)
    if unknown:
        raise InputError(source, f"{where}.{unknown[0]}", "unknown key")
    advantages = advantage_config({k: v for k, v in raw.items() if k in ADVANTAGE_KEYS}, source, where)
    settings = section_from_mapping(RLSettings, {k: v for k, v in raw.items() if k in SETTING_KEYS}, source,
                                    where)
    if advantages.estimator == "tree_grpo" and advantages.group_size % settings.tree_branches:
        raise InputError(source, f"{where}.tree_branches", f"G = {advantages.group_size} leaves must split "
                                                                    f"evenly into {settings.tree_branches} branches")
    return RLConfig(settings, advantages, source)


# ---------------------------------------------------------------------------------------------------
# Log-probabilities and the loss


def sequence_logprobs(model: torch.nn.Module, batch: "RolloutBatch", temperature: float = 1.0) -> torch.Tensor:
    """log π(x_ℓ | x_<ℓ) of every token of `batch.input_ids` where `batch.mask` is 1, from one forward
    pass of `model` (a causal LM, PEFT-wrapped or not, with whichever adapter is active); 0 elsewhere.
    Shape [B, L] like the mask; differentiable unless called under no_grad.

    The LM head runs on the masked tokens' positions only (`masked_token_logits`): in an orchestrator
    episode the system prompt, the task and every worker observation between controller turns cost
    the transformer but not the 49,152-way head, its log-softmax or their backward pass."""
    mask = batch.mask.bool()
    if mask[:, 0].any():
        raise ValueError("position 0 has no preceding token to be predicted from; it cannot be in the mask")
    if not mask.any():
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    from trl.trainer.utils import selective_log_softmax

    rows, cols = torch.nonzero(mask, as_tuple=True)
    logits = masked_token_logits(model, batch, rows, cols)  # [N, V]: the logits that predict each masked token
    chosen = selective_log_softmax(logits.float()[None], batch.input_ids[rows, cols][None], temperature=temperature)[0]
    out = torch.zeros(mask.shape, dtype=chosen.dtype, device=chosen.device)
    return out.index_put((rows, cols), chosen)


def masked_token_logits(model: torch.nn.Module, batch: "RolloutBatch", rows: torch.Tensor,
                        cols: torch.Tensor) -> torch.Tensor:
    """The logits at positions (rows, cols − 1), i.e. those that predict the tokens at (rows, cols):
    the decoder's hidden states at every position, the output head at those only. A model that is not a
    transformers causal LM with a plain linear head (no logit soft-capping) gets its full forward pass,
    logits kept from the first position any row needs."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    plain_head = (hasattr(causal, "get_decoder") and hasattr(causal, "get_output_embeddings")
                  and not getattr(getattr(causal, "config", None), "final_logit_softcapping", None))
    if plain_head:
        # PEFT injects LoRA into the decoder's own modules, so the active adapter acts here as in model().
        hidden = decoder_hidden_states(causal.get_decoder(), batch)
        return causal.get_output_embeddings()(hidden[rows, cols - 1])
    first, length = int(cols.min()), batch.input_ids.shape[1]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                   logits_to_keep=length - first + 1).logits  # positions first − 1 … L − 1
    return logits[rows, cols - first]


# A prefix shorter than this is run with the rest: the saving would not pay for the second call.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(batch: "RolloutBatch") -> int:
    """How many leading tokens every row of the batch has in common (ids equal, none of them padding)."""
    same = (batch.input_ids == batch.input_ids[:1]).all(dim=0) & (batch.attention_mask == 1).all(dim=0)
    return int(torch.cumprod(same.to(torch.int64), dim=0).sum())


def decoder_hidden_states(decoder: torch.nn.Module, batch: "RolloutBatch") -> torch.Tensor:
    """The decoder's last hidden states, [B, L, H], with the rows' common prefix run once.

    The G conversations of a group open with the same system prompt and task, several hundred tokens
    before the controller's first one (the compact prompt alone is 348), and often with the same first
    turn. That common prefix runs as a batch of one; its keys and values are repeated for every row and
    the rest runs on top of them, and autograd sums the rows' gradients back into the one prefix. It is
    the arithmetic of running every row whole (tests/models/orchestrator/test_rl.py holds log-probs and
    gradients equal) in about (P + G·S) / (G·(P + S)) of the transformer's work, for a prefix of P
    tokens and suffixes of S."""
    rows, length = batch.input_ids.shape
    start = min(shared_prefix_length(batch), length - 1) if rows > 1 else 0
    if start < MIN_SHARED_PREFIX:
        return decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       use_cache=False).last_hidden_state
    prefix = decoder(input_ids=batch.input_ids[:1, :start], attention_mask=batch.attention_mask[:1, :start],
                     use_cache=True)
    cache = prefix.cache
    cache.batch_repeat_interleave(rows)  # differentiable: each row's gradient flows back into the prefix
    rest = decoder(input_ids=batch.input_ids[:, start:], attention_mask=batch.attention_mask, cache=cache,
                   use_cache=True)
    return torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), rest.last_hidden_state], dim=1)


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, clip_epsilon: float = 0.2,
                kl_beta: float = 1e-3, token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate plus β·KL (module docstring; 004 §4.2 eq. 7, App. B eqs. B.3/B.4), over the
    tokens where `mask` is 1. All tensors share one shape ([B, L] or [N]); only new_logprobs carries
    gradient. Returns (loss, diagnostics): loss_policy and loss_kl (the two terms, β applied), kl (mean
    k3), ratio (mean ρ), clip_fraction (share of tokens whose gradient the clip removed: ρ < 1−ε with
    Â < 0, or ρ > 1+ε with Â > 0), advantage (mean Â), tokens (N).

    Averaging: one mean over every controller token of the batch (the group's G conversations), each
    token weighted alike. Eq. 7 sums min(·) over i and ℓ ∈ T_i with no per-sequence normalisation, so
    this is eq. 7 divided by N, which keeps the step size independent of how many tokens a batch has.
    It is the token-level loss of DAPO (Yu et al. 2025, cited by 003) and TRL's loss_type="dapo"; the
    original GRPO (Shao et al. 2024) instead averages within each sequence, then over sequences, which
    gives a token of a long trajectory (a decomp-repair chain, App. E) less weight than one of a lazy
    one-turn answer. β·k3 is averaged over the same tokens.

    KL: eq. 7 writes D̂_KL = ρ − log ρ − 1 with the importance ratio's symbol, but the penalty is to the
    frozen reference (§4.2; App. A.2 "against an SFT-frozen router reference"), so ρ there is
    π_ref/π_θ: Schulman's k3 estimator of KL(π_θ‖π_ref), as in GRPO (Shao et al. 2024) and TRL. It is
    ≥ 0 token by token, and unbiased for samples from π_θ (ours are from π_old; at ε-close policies
    the difference is second order, and TRL leaves it uncorrected by default too).

    token_weights (no gradient): each token's surrogate term times its weight, the truncated importance
    weight of RLSettings.tis_cap; None: 1."""
    shapes = {t.shape for t in (new_logprobs, old_logprobs, ref_logprobs, advantages, mask)}
    if token_weights is not None:
        shapes.add(token_weights.shape)
    if len(shapes) != 1:
        raise ValueError(f"policy_loss needs tensors of one shape, got {sorted(map(tuple, shapes))}")
    keep = mask.bool()
    n = int(keep.sum())
    if n == 0:
        raise ValueError("the mask selects no controller token: nothing to train on")
    zero = torch.zeros((), dtype=new_logprobs.dtype, device=new_logprobs.device)
    # Masked positions are zeroed before exp(), so whatever they hold cannot overflow or turn into NaN.
    log_ratio = torch.where(keep, new_logprobs - old_logprobs, zero)
    ratio = torch.exp(log_ratio)
    adv = torch.where(keep, advantages.to(new_logprobs.dtype), zero)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * adv)
    if token_weights is not None:
        surrogate = surrogate * token_weights.detach().to(surrogate.dtype)
    log_ref_ratio = torch.where(keep, ref_logprobs - new_logprobs, zero)
    k3 = torch.exp(log_ref_ratio) - log_ref_ratio - 1  # ≥ 0 everywhere, 0 where π_θ = π_ref

    def mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, x, zero).sum() / n

    loss_policy, kl = -mean(surrogate), mean(k3)
    loss = loss_policy + kl_beta * kl
    with torch.no_grad():
        clipped = ((ratio < 1 - clip_epsilon) & (adv < 0)) | ((ratio > 1 + clip_epsilon) & (adv > 0))
        stats = {"loss_policy": float(loss_policy), "loss_kl": float(kl_beta * kl), "kl": float(kl),
                 "ratio": float(mean(ratio)), "clip_fraction": float(mean(clipped.to(ratio.dtype))),
                 "advantage": float(mean(adv)), "tokens": float(n)}
    return loss, stats


# ---------------------------------------------------------------------------------------------------
# The batch


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s: the controller's turns, in order."""
    m = np.asarray(mask, dtype=np.int64)
    starts = np.flatnonzero(np.diff(np.concatenate(([0], m))) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate((m, [0]))) == -1) + 1
    return list(zip(starts.tolist(), ends.tolist()))


@dataclass(frozen=True)
class RolloutBatch:
    """G tokenised conversations, right-padded to one length L, ready for `policy_loss`.

    mask is 1 on the controller's tokens: each assistant turn's content and the end-of-turn token that
    stopped it, exactly SFT's assistant mask (sft_data.tokenize_conversation; §4.2: "𝒯_i coincides with
    the SFT loss mask"). advantages holds each turn's advantage on that turn's tokens, 0 elsewhere.

    Old log-probs. The default is to recompute them with the policy before the update (`RLTrainer.step`
    takes them from its own forward pass; `RLTrainer.prepare` computes them ahead, for several epochs),
    for three reasons: (1) the conversation is re-tokenised from its text, and BPE need not give back the
    ids that were generated (a turn sampled as " 4" "2" re-encodes as " 42"; special tokens the policy
    emitted are dropped from the text), so generated log-probs need not belong to the tokens trained on; (2) they are of the sampler's distribution, which top-p
    renormalises and the trainer cannot reproduce; (3) a fresh forward pass gives π_old with the very
    computation π_θ gets (ρ = 1 exactly at the first update, rather than off by batched-decoding
    rounding). This is exact when rollouts are sampled by the policy being trained, as in a synchronous
    loop. When they come from an older checkpoint (asynchronous rollouts), pass the ControllerTurns:
    a turn's generated log-probs are used where its re-tokenised ids equal its generated ids, and only
    there (`old_known`); the other turns are recomputed. Given log-probs must come from logits / T with
    top_p = 1 (RLSettings.temperature), or the ratio is biased.

    A turn cut at the controller's max_new_tokens has no end-of-turn token, but the chat template
    appends one; when the ControllerTurns show this, that token is taken out of the mask (the policy
    did not choose to stop there). Without them it cannot be told apart and stays in, as in SFT."""

    input_ids: torch.Tensor  # [B, L] int64, right-padded with the tokenizer's pad id
    attention_mask: torch.Tensor  # [B, L] int64
    mask: torch.Tensor  # [B, L] int64: 1 on controller tokens
    advantages: torch.Tensor  # [B, L] float32: the turn's advantage on its tokens, 0 elsewhere
    turn_index: torch.Tensor  # [B, L] int64: the assistant turn (0-based) a controller token belongs to, −1 elsewhere
    old_logprobs: torch.Tensor  # [B, L] float32: meaningful where old_known
    old_known: torch.Tensor  # [B, L] bool: old log-probs given (or already computed) at these positions
    ref_logprobs: torch.Tensor | None = None  # [B, L] float32, filled by RLTrainer.prepare
    truncated: int = 0  # conversations cut at max_length
    # The rollout engine's own log-probs of the trained tokens, where known (RLSettings.tis_cap); the
    # RL stage moves the turns' given log-probs here and has the trainer recompute the old ones.
    sampler_logprobs: torch.Tensor | None = None  # [B, L] float32
    sampler_known: torch.Tensor | None = None  # [B, L] bool

    def with_sampler_logprobs(self) -> "RolloutBatch":
        """The batch with its given old log-probs taken as the sampler's (truncated importance weights)
        and none as old: the trainer recomputes π_old, so ρ = 1 exactly at a synchronous update."""
        return dataclasses.replace(self, sampler_logprobs=self.old_logprobs, sampler_known=self.old_known,
                                   old_known=torch.zeros_like(self.old_known))

    @property
    def prepared(self) -> bool:
        """Old and reference log-probs known on every controller token."""
        return self.ref_logprobs is not None and bool((self.old_known | (self.mask == 0)).all())

    @property
    def controller_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: str | torch.device) -> "RolloutBatch":
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)

    @classmethod
    def from_conversations(cls, tokenizer: Any, conversations: Sequence[list[Message]],
                           advantages: Sequence[Sequence[float]],
                           turns: Sequence[Sequence[ControllerTurn | None] | None] | None = None,
                           max_length: int | None = None) -> "RolloutBatch":
        """conversations: as the executor records them (system, user task, then assistant turns and user
        <obs> turns). advantages[i][k]: the advantage of conversation i's k-th assistant turn (one array
        per rollout, as advantages.turn_advantages returns them). turns[i][k]: the ControllerTurn that
        produced that assistant turn (None, or a None entry: recompute). max_length: tokens kept per
        conversation (its start; a turn cut short keeps its advantage on the tokens left)."""
        if len(advantages) != len(conversations):
            raise ValueError(f"{len(conversations)} conversations but {len(advantages)} advantage arrays")
        if turns is not None and len(turns) != len(conversations):
            raise ValueError(f"{len(conversations)} conversations but {len(turns)} ControllerTurn lists")
        if not conversations:
            raise ValueError("a rollout batch needs at least one conversation")
        rows = []
        for i, messages in enumerate(conversations):
            try:
                rows.append(tokenize_rollout(tokenizer, messages, advantages[i], None if turns is None else turns[i]))
            except ValueError as exc:
                raise ValueError(f"conversation {i}: {exc}") from exc
        truncated = 0
        if max_length is not None:
            truncated = sum(len(r[0]) > max_length for r in rows)
            rows = [tuple(column[:max_length] for column in r) for r in rows]
        length = max(len(r[0]) for r in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        def padded(column: int, fill: Any, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([list(r[column]) + [fill] * (length - len(r[column])) for r in rows], dtype=dtype)

        return cls(input_ids=padded(0, pad, torch.int64),
                   attention_mask=torch.tensor([[1] * len(r[0]) + [0] * (length - len(r[0])) for r in rows]),
                   mask=padded(1, 0, torch.int64), advantages=padded(2, 0.0, torch.float32),
                   turn_index=padded(3, -1, torch.int64), old_logprobs=padded(4, 0.0, torch.float32),
                   old_known=padded(5, False, torch.bool), truncated=truncated)


def tokenize_rollout(tokenizer: Any, messages: list[Message], advantages: Sequence[float],
                     turns: Sequence[ControllerTurn | None] | None) -> tuple[list, ...]:
    """One conversation as columns (input_ids, mask, advantages, turn_index, old_logprobs, old_known)."""
    tokenized = tokenize_conversation(tokenizer, messages)
    ids, mask = tokenized.input_ids, list(tokenized.assistant_masks)
    token_adv = masked_token_advantages(advantages, mask).tolist()  # checks one advantage per turn
    runs = mask_runs(mask)
    turn_index = [-1] * len(ids)
    for k, (start, end) in enumerate(runs):
        turn_index[start:end] = [k] * (end - start)
    old, known = [0.0] * len(ids), [False] * len(ids)
    if turns is not None:
        if len(turns) != len(runs):
            raise ValueError(f"{len(turns)} ControllerTurns for {len(runs)} assistant turns")
        for k, ((start, end), turn) in enumerate(zip(runs, turns)):
            if turn is None or turn.token_ids is None or turn.token_logprobs is None:
                continue
            generated, logprobs = list(turn.token_ids), list(turn.token_logprobs)
            if len(generated) != len(logprobs):
                raise ValueError(f"turn {k}: {len(generated)} token ids but {len(logprobs)} log-probs")
            tokens = ids[start:end]
            if generated == tokens[:-1] and not turn_stopped(tokenizer, generated):
                # Cut at max_new_tokens: the template's end-of-turn token was not the policy's choice.
                mask[end - 1], token_adv[end - 1], turn_index[end - 1] = 0, 0.0, -1
                tokens = tokens[:-1]
            if generated == tokens:
                old[start:start + len(tokens)] = logprobs
                known[start:start + len(tokens)] = [True] * len(tokens)
            else:
                log.debug("turn %d: re-tokenised ids differ from the generated ones; its old log-probs are "
                          "recomputed", k)
    return ids, mask, token_adv, turn_index, old, known


def turn_stopped(tokenizer: Any, generated: Sequence[int]) -> bool:
    """Whether a generated turn ends with an end-of-turn token (the tokenizer's EOS or <|im_end|>)."""
    if not generated:
        return False
    ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return generated[-1] in ends


# ---------------------------------------------------------------------------------------------------
# The trainer


def lora_config(settings: RLSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=0.0,
                      target_modules=list(settings.lora_target_modules), bias="none", task_type="CAUSAL_LM")


def adapter_fingerprint(folder: Path) -> str:
    """sha256 of an adapter folder's config and weights: a resumed run must meet the same reference."""
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        path = Path(folder) / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def check_adapter_folder(folder: Path) -> Path:
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise InputError(folder, "<folder>", "not a PEFT adapter folder (no adapter_config.json)")
    return folder


def disable_dropout(model: torch.nn.Module) -> None:
    """p = 0 in every dropout module (TRL's disable_dropout_in_model): the log-probs are a deterministic
    function of the weights in train and eval mode alike."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


def freeze_lower_layers(model: torch.nn.Module, trainable_layers: int) -> None:
    """requires_grad = False on the policy adapter's LoRA weights below the top `trainable_layers`
    decoder layers (0: leave every layer trainable)."""
    if trainable_layers <= 0:
        return
    total = model.get_base_model().config.num_hidden_layers if hasattr(model, "get_base_model") else \
        model.config.num_hidden_layers
    lowest = max(total - trainable_layers, 0)
    for name, param in model.named_parameters():
        found = LAYER_INDEX.search(name)
        if f".{POLICY_ADAPTER}." in name and found and int(found.group(1)) < lowest:
            param.requires_grad_(False)


class RLTrainer:
    """The trainable LoRA policy, its frozen reference, AdamW and a step count.

    Reference (App. A.2: "KL regularisation ... against an SFT-frozen router reference"). Both options
    share the one copy of the base weights:
    - no SFT adapter: the reference is the base model, evaluated inside PEFT's `disable_adapter()`;
    - an SFT adapter: the policy starts as a trainable copy of it (adapter "default") and the reference
      is a second, frozen copy (adapter "reference") on the same base, made active only for the
      reference's no-grad forward pass. A LoRA adapter is ~2% of SmolLM2's weights (r = 8 on every
      projection); a second whole model would double the memory and the load time.

    Use: `trainer.step(batch)` for one update per rollout group (the synchronous loop; the old
    log-probs it needs come from its own forward pass). For several PPO epochs on the same rollouts,
    `batch = trainer.prepare(batch)` first (old and reference log-probs, no grad), then
    `trainer.step(batch)` per epoch: the old log-probs stay those of the policy before the first.
    `save(dir)` / `resume(dir)` checkpoint the adapter, AdamW's state and the step count; the writes
    are atomic."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, settings: RLSettings, base_folder: Path,
                 sft_adapter: Path | None, step: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.base_folder = Path(base_folder)
        self.sft_adapter = None if sft_adapter is None else Path(sft_adapter)
        self.sft_fingerprint = None if sft_adapter is None else adapter_fingerprint(Path(sft_adapter))
        self.device = next(model.parameters()).device
        self.step_count = step
        disable_dropout(model)
        model.eval()
        freeze_lower_layers(model, settings.trainable_layers)
        self.parameters = [p for name, p in model.named_parameters() if p.requires_grad]
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        if not names or any(f".{POLICY_ADAPTER}." not in name for name in names):
            raise RouteropsError(f"expected only the policy adapter's LoRA weights to be trainable, got {names[:3]}")
        self.optimizer = torch.optim.AdamW(self.parameters, lr=settings.learning_rate,
                                           weight_decay=settings.weight_decay)

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def create(cls, settings: RLSettings, base_folder: str | Path,
               sft_adapter: str | Path | None = None) -> "RLTrainer":
        """A fresh run: a new LoRA adapter (settings' lora keys, initialised under settings.seed) on the
        base model in base_folder, or a trainable copy of the SFT adapter in `sft_adapter`."""
        return cls.build(settings, Path(base_folder), sft_adapter=None if sft_adapter is None else Path(sft_adapter))

    @classmethod
    def build(cls, settings: RLSettings, base_folder: Path, sft_adapter: Path | None,
              policy_adapter: Path | None = None, step: int = 0) -> "RLTrainer":
        from peft import PeftModel, get_peft_model

        device = resolve_device(settings.device, "rl settings")
        base = load_causal_lm(base_folder, settings.dtype, device)
        start = policy_adapter or sft_adapter
        if start is not None:
            model = PeftModel.from_pretrained(base, str(check_adapter_folder(start)), adapter_name=POLICY_ADAPTER,
                                              is_trainable=True)
        else:
            with seeded(settings.seed, device):
                model = get_peft_model(base, lora_config(settings), adapter_name=POLICY_ADAPTER)
        if sft_adapter is not None:
            model.load_adapter(str(check_adapter_folder(sft_adapter)), adapter_name=REFERENCE_ADAPTER,
                               is_trainable=False)
            model.set_adapter(POLICY_ADAPTER)  # active and trainable; the reference stays frozen
        return cls(model, load_tokenizer(base_folder), settings, base_folder, sft_adapter, step)

    @classmethod
    def resume(cls, checkpoint: str | Path, settings: RLSettings | None = None) -> "RLTrainer":
        """The trainer saved in `checkpoint`: its adapter, AdamW state and step count, the same base and
        the same reference. Other settings than the checkpoint's, or an SFT adapter whose bytes changed
        since, are refused rather than mixed into the run."""
        checkpoint = Path(checkpoint)
        state_file = checkpoint / STATE_FILE
        if not state_file.is_file():
            raise InputError(checkpoint, STATE_FILE, "not an RL checkpoint (no state file)")
        state = json.loads(state_file.read_text())
        recorded = state["settings"]
        saved = RLSettings(**{**recorded, "lora_target_modules": tuple(recorded["lora_target_modules"])})
        if settings is not None and settings != saved:
            changed = sorted(k for k in recorded if getattr(settings, k) != getattr(saved, k))
            raise RouteropsError(f"{checkpoint} was trained with other settings ({', '.join(changed)} differ); "
                                 "start a new run to change them")
        sft_adapter = None if state["sft_adapter"] is None else Path(state["sft_adapter"])
        if sft_adapter is not None and adapter_fingerprint(sft_adapter) != state["sft_adapter_sha256"]:
            raise RouteropsError(f"the reference adapter {sft_adapter} changed since {checkpoint} was saved; "
                                 "the KL term would measure against another policy")
        trainer = cls.build(saved, Path(state["base_folder"]), sft_adapter, policy_adapter=checkpoint / ADAPTER_DIR,
                            step=int(state["step"]))
        optimizer_state = torch.load(checkpoint / OPTIMIZER_FILE, map_location=trainer.device, weights_only=True)
        trainer.optimizer.load_state_dict(optimizer_state)
        return trainer

    # -- the update --------------------------------------------------------------------------------

    @property
    def reference_is_base(self) -> bool:
        return self.sft_adapter is None

    @contextmanager
    def reference(self) -> Iterator[None]:
        """The frozen reference policy active for the duration (call under no_grad)."""
        try:
            if self.reference_is_base:
                with self.model.disable_adapter():
                    yield
                return
            self.model.set_adapter(REFERENCE_ADAPTER, inference_mode=True)  # active, and frozen like the rest
            try:
                yield
            finally:
                self.model.set_adapter(POLICY_ADAPTER)  # re-marks the policy trainable, the reference frozen
        finally:
            # Re-enabling or setting an adapter marks all its weights trainable again.
            freeze_lower_layers(self.model, self.settings.trainable_layers)

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, reference: bool = False) -> torch.Tensor:
        """The controller tokens' log-probs under the current policy (or the reference), no grad."""
        batch = batch.to(self.device)
        if reference:
            with self.reference():
                return sequence_logprobs(self.model, batch, self.settings.temperature)
        return sequence_logprobs(self.model, batch, self.settings.temperature)

    def prepare(self, batch: RolloutBatch) -> RolloutBatch:
        """The batch with old log-probs on every controller token (given ones kept, the rest from the
        current policy) and the reference's log-probs; a batch already prepared is returned as is."""
        batch = batch.to(self.device)
        if batch.prepared:
            return batch
        mask = batch.mask.bool()
        old, known = batch.old_logprobs, batch.old_known
        if not bool((known | ~mask).all()):
            old = torch.where(known, old, self.logprobs(batch))
            known = known | mask
        ref = batch.ref_logprobs if batch.ref_logprobs is not None else self.logprobs(batch, reference=True)
        return dataclasses.replace(batch, old_logprobs=old, old_known=known, ref_logprobs=ref)

    def step(self, batch: RolloutBatch) -> dict[str, float]:
        """One AdamW update on the batch; returns the loss and its diagnostics as they were before the
        update (policy_loss's keys), the gradient norm before clipping, the mean log-prob of the
        controller tokens, the step count after the update and the step's seconds.

        Old log-probs neither given nor prepared are taken from this update's own forward pass, detached:
        the weights are those `prepare` would have used a moment earlier, so the values are the same
        (ρ = 1 exactly) for one forward pass fewer (TRL's GRPOTrainer does the same at num_iterations =
        1; benchmarks/rl_step.py measures it). Only the reference's no-grad pass runs first."""
        return self.step_accumulated([batch])

    def step_accumulated(self, batches: Sequence[RolloutBatch]) -> dict[str, float]:
        """One AdamW update on several minibatches: each one's backward pass in turn (memory stays at one
        minibatch), its loss weighted by its share of the controller tokens, so the update follows the
        gradient of the one token mean over all of them (policy_loss's averaging) and a minibatch whose
        advantages all point one way cannot take a full Adam step of its own. Diagnostics are the
        token-weighted means over the minibatches; `step` with one batch is this."""
        started = time.perf_counter()
        tokens = [int(b.mask.sum()) for b in batches]
        total = max(sum(tokens), 1)
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[tuple[float, dict, float]] = []
        for batch, n in zip(batches, tokens):
            batch = batch.to(self.device)
            if batch.ref_logprobs is None:
                batch = dataclasses.replace(batch, ref_logprobs=self.logprobs(batch, reference=True))
            new = sequence_logprobs(self.model, batch, self.settings.temperature)
            old = torch.where(batch.old_known, batch.old_logprobs, new.detach())
            weights, drift = self.sampler_correction(batch, old)
            loss, stats = policy_loss(new, old, batch.ref_logprobs, batch.advantages, batch.mask,
                                      self.settings.clip_epsilon, self.settings.kl_beta, weights)
            stats.update(drift)
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise RouteropsError(f"RL step {self.step_count + 1}: the loss is {float(loss)}; no update made")
            (loss * (n / total)).backward()
            parts.append((float(loss.detach()), stats, float(new.detach()[batch.mask.bool()].mean())))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.settings.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        weights = [n / total for n in tokens]
        mean = lambda values: float(sum(w * v for w, v in zip(weights, values)))  # noqa: E731
        # The sampler's drift is known on a minibatch only where its turns gave log-probs: kept when all did.
        stats = {k: mean([p[1][k] for p in parts]) for k in parts[0][1] if all(k in p[1] for p in parts)}
        for count in ("tokens", "sampler_tokens"):  # counts add up; the rest are token-weighted means
            if count in stats:
                stats[count] = float(sum(p[1][count] for p in parts))
        return {"loss": mean([p[0] for p in parts]), **stats, "grad_norm": float(grad_norm),
                "logprob": mean([p[2] for p in parts]), "step": float(self.step_count),
                "seconds": time.perf_counter() - started}

    def sampler_correction(self, batch: RolloutBatch, old: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The truncated importance weights min(π_old / π_sampler, tis_cap) on the tokens whose sampler
        log-prob is known (1 elsewhere; None when off or unknown everywhere), and the drift between the
        two: sampler_drift (mean |log π_old − log π_sampler|), sampler_drift_max, sampler_tokens and
        tis_weight (the weights' mean) over those tokens."""
        if batch.sampler_known is None or batch.sampler_logprobs is None:
            return None, {}
        known = batch.sampler_known & batch.mask.bool()
        if not bool(known.any()):
            return None, {}
        with torch.no_grad():
            log_w = torch.where(known, old - batch.sampler_logprobs, torch.zeros_like(old))
            gap = log_w[known].abs()
            drift = {"sampler_drift": float(gap.mean()), "sampler_drift_max": float(gap.max()),
                     "sampler_tokens": float(known.sum())}
            if self.settings.tis_cap == 0:
                return None, drift
            weights = torch.clamp(torch.exp(log_w), max=self.settings.tis_cap)
            return weights, {**drift, "tis_weight": float(weights[known].mean())}

    @property
    def finished(self) -> bool:
        return self.step_count >= self.settings.max_steps

    @property
    def checkpoint_due(self) -> bool:
        return self.step_count > 0 and self.step_count % self.settings.save_steps == 0

    # -- checkpoints -------------------------------------------------------------------------------

    def save(self, checkpoint: str | Path) -> Path:
        """Write the policy adapter (a plain PEFT folder: load_controller_model and merge_adapter take
        it as it is), AdamW's state and the run's state to `checkpoint`. Written beside it and renamed
        into place, so an interrupted save leaves the previous checkpoint, never half of one."""
        checkpoint = Path(checkpoint)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint.with_name(f".{checkpoint.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self.model.save_pretrained(str(tmp / ADAPTER_DIR), selected_adapters=[POLICY_ADAPTER])
        self.tokenizer.save_pretrained(str(tmp / ADAPTER_DIR))  # the adapter folder alone serves or merges
        torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        state = {"step": self.step_count, "settings": dataclasses.asdict(self.settings),
                 "base_folder": str(self.base_folder),
                 "sft_adapter": None if self.sft_adapter is None else str(self.sft_adapter),
                 "sft_adapter_sha256": self.sft_fingerprint}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        # Between these two renames a crash leaves the previous checkpoint under .<name>.old-<pid>.
        old = checkpoint.with_name(f".{checkpoint.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        if checkpoint.exists():
            os.replace(checkpoint, old)
        os.replace(tmp, checkpoint)
        shutil.rmtree(old, ignore_errors=True)
        return checkpoint
