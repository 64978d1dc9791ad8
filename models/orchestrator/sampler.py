"""The RL stage's rollout engine on a CPU: a batched, KV-cached sampler over a merged copy of the policy.

Why not `LMController` (transformers' `generate`) during RL: every decode step of the PEFT model runs
the base projection and, beside it, the LoRA pair (A then B) of all seven projections of every layer,
each a separate small matmul with its own Python dispatch, plus generate()'s logits processors and
per-step bookkeeping; on two cores that made one batched decode step of SmolLM2-135M cost ~0.35 s
(benchmarks/results/rl_step.json before this module). Here:

- **merged weights**: one inference copy of the model whose projections hold W + (α/r)·B·A of the
  policy's active adapter (`merge_policy`), re-merged after each update (`sync`): 7 × 30 GEMMs of
  rank 8, milliseconds; a decode step is then one plain dense forward;
- **a KV cache** (transformers' DynamicCache) and left padding with explicit positions;
- **finished rows leave the batch** (`DynamicCache.batch_select_indices`): a group whose rollouts
  stop at different lengths decodes only the rows still running;
- the log-probability of each drawn token is taken from the same log-softmax it was drawn from
  (logits / T, renormalised over the top-p nucleus when top_p < 1), as `LMController` reports it.

Agreement with the trainer (the ratio of eq. 7 / App. B.3 must compare the distribution the tokens
were drawn from): `RLTrainer` recomputes log π(x_ℓ | h_ℓ) with the unmerged LoRA model on right-
padded, re-tokenised conversations, all positions at once. The two differ only in float32 rounding
(merged vs. factored weights, cached vs. full attention, other padding); tests/models/orchestrator/
test_sampler.py bounds the difference on the same tokens, and benchmarks/rl_step.py reports it at the
real model's size.

Alternatives: models/orchestrator/llama_sampler.py (engine llama_cpp) runs the same float32 weights
and adapter through llama.cpp, ~3x faster on a CPU (not Q4_1: its 8-bit activations would move the
log-probs by far more than rounding); vLLM needs a GPU.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from models.orchestrator.config import GenerationSettings
from models.orchestrator.llama_engine import common_prefix  # torch-free: the engine process shares it
from models.orchestrator.lm import (LMController, eos_token_ids, turn_length)
from routerops.orchestra.controller import ControllerTurn, Message


def base_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def active_adapter(model: torch.nn.Module) -> str | None:
    """The PEFT model's active adapter name (None for a plain model)."""
    name = getattr(model, "active_adapter", None)
    return name if isinstance(name, str) else None


@torch.no_grad()
def merge_policy(model: torch.nn.Module, engine: torch.nn.Module) -> None:
    """Write the weights of `model` (a PEFT model with its active LoRA adapter, or a plain model) into
    `engine` (a plain model of the same architecture): each LoRA-wrapped projection becomes
    W + get_delta_weight(active) — PEFT's own (α/r)·B·A, so scaling and fan-in conventions are PEFT's;
    every other tensor is copied. The source model is not changed (unlike PEFT's merge_adapter)."""
    from peft.tuners.lora import LoraLayer

    source = base_of(model)
    adapter = active_adapter(model)
    source_modules = dict(source.named_modules())
    for name, module in engine.named_modules():
        src = source_modules.get(name)
        if isinstance(src, LoraLayer):
            weight = src.base_layer.weight.detach()
            # Inside PEFT's disable_adapter() (the reference is the base model) the layers report it.
            if adapter in src.lora_A and adapter in src.active_adapters and not src.disable_adapters and not src.merged:
                weight = weight + src.get_delta_weight(adapter).to(weight.dtype)
            module.weight.copy_(weight)
            if getattr(module, "bias", None) is not None:
                module.bias.copy_(src.base_layer.bias)
        elif src is not None and not isinstance(src, LoraLayer):
            for pname, param in module.named_parameters(recurse=False):
                param.copy_(getattr(src, pname))
            for bname, buffer in module.named_buffers(recurse=False):
                buffer.copy_(getattr(src, bname))


def build_engine(model: torch.nn.Module) -> torch.nn.Module:
    """A plain causal LM of `model`'s architecture (sdpa attention), in eval mode, on its device."""
    from transformers import AutoModelForCausalLM

    base = base_of(model)
    config = base.config
    param = next(base.parameters())
    engine = AutoModelForCausalLM.from_config(config, dtype=param.dtype, attn_implementation="sdpa")
    engine.to(param.device).eval()
    for p in engine.parameters():
        p.requires_grad_(False)
    merge_policy(model, engine)
    return engine


def nucleus_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log-probabilities of the distribution tokens are drawn from: softmax(logits / T), restricted to
    the smallest set of most likely tokens whose mass reaches top_p and renormalised there (−inf
    outside). T = 0 means greedy: the plain softmax (what LMController reports for greedy turns)."""
    logp = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    if temperature > 0 and top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()
        drop_sorted = mass_before >= top_p  # keeps the first token always
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


class FastSampler:
    """The Controller contract (routerops.orchestra.controller) over a merged, KV-cached copy of a
    policy; the drop-in for `LMController` in the RL stage (module docstring).

    `sync()` after each optimiser step re-merges the policy's adapter, so every rollout group is drawn
    from the policy as the previous update left it. Counters (`tokens`, `seconds`) give throughput."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings, name: str = "lm",
                 version: str = "1"):
        self.policy = model
        self.engine = build_engine(model)
        self.tokenizer = tokenizer
        self.settings = settings
        self.name = name
        self.version = version
        self.device = next(self.engine.parameters()).device
        self.eos = eos_token_ids(base_of(model), tokenizer)
        # transformers ≥ 5.2x names the KV cache argument `cache` and deprecates `past_key_values`.
        self.cache_arg = "cache" if "cache" in inspect.signature(self.engine.forward).parameters else "past_key_values"
        self.calls = 0
        # End-of-turn tokens are masked until this many are drawn (benchmarks force equal lengths on
        # every side with it, as transformers' min_new_tokens); 0 in the stage.
        self.min_new_tokens = 0
        # Optional steer(row's generated ids, its logits) -> logits, applied before each token is drawn
        # (models/critique/verdict_threshold.py: the critique verdict at a threshold fitted on
        # validation). For greedy evaluation and serving only: the reported log-probabilities are the
        # steered distribution's, so a steered sampler must not feed RL.
        self.steer: Callable[[list[int], torch.Tensor], torch.Tensor] | None = None
        self.tokens = 0  # generated tokens, all calls
        self.seconds = 0.0  # time inside generate_batch, all calls
        self.lock = threading.Lock()
        # KV caches of shared prompt prefixes under the current weights (prefix_state); oldest dropped.
        self.prefixes: dict[tuple[int, ...], Any] = {}
        self.max_prefixes = 8
        self.min_prefix = 16

    def sync(self) -> None:
        """Re-merge the policy's current adapter weights into the engine."""
        with self.lock:
            merge_policy(self.policy, self.engine)
            self.prefixes.clear()  # keys and values of the old weights

    # LMController's: conversations checked, cut into batch_size batches, call n sampled under seed + n.
    respond = LMController.respond

    def encode(self, conversations: Sequence[list[Message]]) -> list[list[int]]:
        prompts = [self.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                   for m in conversations]
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def prefix_state(self, shared: list[int]) -> tuple[Any, int]:
        """A batch-1 KV cache of the longest stored prefix of `shared`, extended to all of `shared`
        but its last token (which the suffix pass must see to give the first logits), and its length.

        The system prompt (grammar, pool table) opens every conversation, and a group's G rollouts
        share the task too: their keys and values are computed once per call instead of G times,
        and the system prompt's once per weights version (`sync` clears the store)."""
        import copy

        upto = shared[:-1]
        best: tuple[int, ...] = ()
        for key in self.prefixes:
            if len(key) > len(best) and len(key) <= len(upto) and tuple(upto[:len(key)]) == key:
                best = key
        if best:
            cache = copy.deepcopy(self.prefixes[best])
        else:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.engine.config)
        rest = upto[len(best):]
        if rest:
            ids = torch.tensor([rest], device=self.device)
            positions = torch.arange(len(best), len(upto), device=self.device)[None]
            self.engine(input_ids=ids, position_ids=positions, **{self.cache_arg: cache}, use_cache=True, logits_to_keep=1)
        if len(upto) >= self.min_prefix and tuple(upto) not in self.prefixes:
            if len(self.prefixes) >= self.max_prefixes:
                self.prefixes.pop(next(iter(self.prefixes)))  # oldest first
            self.prefixes[tuple(upto)] = copy.deepcopy(cache)
        return cache, len(upto)

    @torch.inference_mode()
    def generate_batch(self, conversations: Sequence[list[Message]], seed: int) -> list[ControllerTurn]:
        started = time.perf_counter()
        settings = self.settings
        prompts = self.encode(conversations)
        prompt_lengths = [len(p) for p in prompts]
        shared = common_prefix(prompts)
        cache, start = self.prefix_state(shared)
        rows = len(conversations)
        if start:
            cache.batch_repeat_interleave(rows)
        # Each row's remaining tokens, left-padded between the shared prefix and the suffix: positions
        # continue from the prefix, padding is masked, so every real token sees what it would see alone.
        suffixes = [p[start:] for p in prompts]
        width = max(len(x) for x in suffixes)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos[0]
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in suffixes], device=self.device)
        suffix_mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in suffixes], device=self.device)
        attention = torch.cat([suffix_mask.new_ones(rows, start), suffix_mask], dim=1)
        positions = (start + suffix_mask.cumsum(dim=1) - 1).clamp(min=0)
        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        eos = torch.tensor(self.eos, device=self.device)
        generated: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        alive = torch.arange(rows, device=self.device)  # original row of each row still decoding
        logits = self.engine(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                             **{self.cache_arg: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
        position = positions[:, -1:]
        for drawn in range(settings.max_new_tokens):
            if drawn < self.min_new_tokens:
                logits = logits.index_fill(1, eos, float("-inf"))
            if self.steer is not None:
                logits = torch.stack([self.steer(generated[row], logits[i]) for i, row in enumerate(alive.tolist())])
            logp = nucleus_logprobs(logits, settings.temperature, settings.top_p)
            if settings.temperature > 0:
                token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
            else:
                token = logp.argmax(dim=-1)
            chosen = logp.gather(1, token[:, None]).squeeze(1)
            for row, tok, lp in zip(alive.tolist(), token.tolist(), chosen.tolist()):
                generated[row].append(tok)
                logprobs[row].append(lp)
            running = ~torch.isin(token, eos)
            if not bool(running.any()):
                break
            if not bool(running.all()):  # finished rows leave the batch and its cache
                keep = torch.nonzero(running).squeeze(1)
                cache.batch_select_indices(keep)
                alive, token, attention, position = alive[keep], token[keep], attention[keep], position[keep]
            attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=1)
            position = position + 1
            logits = self.engine(input_ids=token[:, None], attention_mask=attention, position_ids=position,
                                 **{self.cache_arg: cache}, use_cache=True).logits[:, -1]
        eos_set = set(self.eos)
        turns = []
        for row in range(rows):
            n = turn_length(generated[row], eos_set)
            ids = generated[row][:n]
            self.tokens += n
            turns.append(ControllerTurn(
                text=self.tokenizer.decode(ids, skip_special_tokens=True), prompt_tokens=int(prompt_lengths[row]),
                completion_tokens=n, token_logprobs=tuple(logprobs[row][:n]), token_ids=tuple(ids)))
        self.seconds += time.perf_counter() - started
        return turns
