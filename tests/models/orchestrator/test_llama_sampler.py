"""The llama.cpp rollout engine (models/orchestrator/llama_sampler.py) against the trainer.

Tolerance of the log-prob agreement: 1e-3 nats per token, as FastSampler's (test_sampler.py). llama.cpp
runs the same float32 weights (the GGUF the trainer's folder came from, re-written as float32) and the
same LoRA pairs, with float32 keys and values and no flash attention; what is left is float32 rounding
in another summation order: ~3e-5 observed on SmolLM2-135M (with llama.cpp's flash kernel or float16
cache it was ~1e-2, which this bound catches). 1e-3 keeps every first-update ratio π_θ/π_old within
e^±0.001, 200 times inside PPO's clip ε = 0.2 (004 eq. 7). The float16 rollout weights have a bound of
their own (test_float16_rollouts_stay_within_the_stated_drift_of_the_trainer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.orchestrator.config import GenerationSettings
from models.orchestrator.lm import base_gguf
from models.orchestrator import llama_engine
from models.orchestrator.llama_sampler import LlamaCppSampler, rotary_rows, write_lora_gguf
from models.orchestrator.rl import RLSettings, RLTrainer
from models.orchestrator.engines import controller_for
from models.orchestrator.sampler import nucleus_logprobs
from routerops.errors import InputError
from tests.models.orchestrator.test_sampler import prompts, randomise_adapter, trainer_logprobs

TOLERANCE = 1e-3


def test_rotary_rows_are_undone_by_transformers_gguf_loader():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    undo = LlamaTensorProcessor()._reverse_permute_weights
    weight = np.arange(12 * 3, dtype=np.float32).reshape(12, 3)  # 3 heads of 4 rows
    assert not np.array_equal(rotary_rows(weight, 3), weight)
    assert np.array_equal(undo(rotary_rows(weight, 3), 3, 3), weight)
    assert np.array_equal(undo(rotary_rows(weight, 2), 6, 2), weight)  # k: the key-value heads count


def test_a_lora_gguf_holds_the_adapter_tensors_as_given(tmp_path):
    import gguf

    a, b = np.ones((8, 16), np.float32), np.full((32, 8), 0.5, np.float32)
    path = write_lora_gguf({"blk.0.attn_q.weight.lora_a": a, "blk.0.attn_q.weight.lora_b": b}, tmp_path / "x.gguf")
    reader = gguf.GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["adapter.lora.alpha"] == 0.0  # llama.cpp's scale is then 1: PEFT's scaling is in B
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert np.array_equal(tensors["blk.0.attn_q.weight.lora_a"], a)
    assert np.array_equal(tensors["blk.0.attn_q.weight.lora_b"], b)
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9), (1.0, 0.3)])
def test_the_engines_nucleus_is_the_torch_samplers(temperature, top_p):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 3
    ours = llama_engine.nucleus_logprobs(logits.numpy(), temperature, top_p)
    theirs = nucleus_logprobs(logits, temperature, top_p).double().numpy()
    assert np.array_equal(np.isinf(ours), np.isinf(theirs))
    assert np.allclose(ours[~np.isinf(ours)], theirs[~np.isinf(theirs)], atol=1e-5)


def test_draws_follow_the_distribution_and_greedy_takes_the_argmax():
    logp = np.log(np.array([[0.5, 0.3, 0.2, 0.0]] * 20_000) + 1e-300)
    tokens = llama_engine.draw(logp, 1.0, np.random.default_rng(0))
    assert np.allclose(np.bincount(tokens, minlength=4) / len(tokens), [0.5, 0.3, 0.2, 0.0], atol=0.015)
    assert llama_engine.draw(logp[:2], 0.0, np.random.default_rng(0)).tolist() == [0, 0]


@pytest.fixture(scope="module")
def trainer(smollm2_folder) -> RLTrainer:
    trainer = RLTrainer.create(RLSettings(), smollm2_folder)
    randomise_adapter(trainer, 0)
    return trainer


def sampler_of(trainer, spec, smollm2_folder, weights="f32", **settings) -> LlamaCppSampler:
    generation = GenerationSettings(**{"temperature": 1.0, "max_new_tokens": 48, **settings})
    return LlamaCppSampler(trainer.model, trainer.tokenizer, generation, base_gguf(spec), work_dir=smollm2_folder.parent,
                           weights=weights)


@pytest.mark.slow
def test_sampled_log_probs_agree_with_the_trainers_and_follow_each_update(trainer, spec, smollm2_folder):
    sampler = sampler_of(trainer, spec, smollm2_folder)
    conversations = prompts() + prompts()[:1] * 2  # rows of one task (a group) beside other tasks
    lengths = set()
    for seed in (0, 1):
        randomise_adapter(trainer, seed)  # an "update": the policy's adapter changes
        sampler.sync()
        turns = sampler.respond(conversations)
        lengths |= {t.completion_tokens for t in turns}
        mine, theirs, known = trainer_logprobs(trainer, conversations, turns)
        assert int(known.sum()) >= 0.8 * sum(t.completion_tokens for t in turns)
        assert float((mine - theirs).abs()[known].max()) < TOLERANCE
    assert len(lengths) > 1, "rows should stop at different lengths (finished rows leave the batch)"
    randomise_adapter(trainer, 2)  # without sync the sampler keeps the last weights it was given
    stale = sampler.respond(conversations)
    mine, theirs, known = trainer_logprobs(trainer, conversations, stale)
    assert float((mine - theirs).abs()[known].max()) > 100 * TOLERANCE
    randomise_adapter(trainer, 0)


@pytest.mark.slow
def test_float16_rollouts_stay_within_the_stated_drift_of_the_trainer(trainer, spec, smollm2_folder):
    """RLSettings.rollout_weights = f16: llama.cpp multiplies float16 weights with float16-rounded
    activations. Bounds: 5e-3 nats a token on average, 5e-2 at most (~1.5e-3 and ~1.2e-2 measured,
    experiments/llama_engine_precision.py). At 5e-2 a first-update truncated importance weight
    π_old/π_sampler stays within e^±0.05, far from its cap of 2, and the ratio of eq. 7 is the trainer's
    own (π_old recomputed). Above f32's ~3e-5: the float16 copy is the one in use."""
    sampler = sampler_of(trainer, spec, smollm2_folder, weights="f16")
    conversations = prompts() + prompts()[:1] * 2
    turns = sampler.respond(conversations)
    mine, theirs, known = trainer_logprobs(trainer, conversations, turns)
    gap = (mine - theirs).abs()[known]
    assert int(known.sum()) >= 50  # tokens whose re-tokenised ids are the drawn ones: enough to measure
    assert float(gap.mean()) < 5e-3 and float(gap.max()) < 5e-2
    assert float(gap.max()) > 1e-4
    sampler.close()


@pytest.mark.slow
def test_a_warm_prefix_gives_what_a_cold_sampler_gives(trainer, spec, smollm2_folder):
    warm = sampler_of(trainer, spec, smollm2_folder)
    warm.respond(prompts()[:2])  # leaves the system prompt (and more) in sequence 0
    cold = sampler_of(trainer, spec, smollm2_folder)
    again, fresh = warm.generate_batch(prompts(), seed=5), cold.generate_batch(prompts(), seed=5)
    assert [t.token_ids for t in again] == [t.token_ids for t in fresh]
    assert [t.token_logprobs for t in again] == [t.token_logprobs for t in fresh]


@pytest.mark.slow
def test_a_batch_the_cache_cannot_hold_runs_in_parts_and_an_oversized_prompt_is_refused(trainer, spec, smollm2_folder):
    generation = GenerationSettings(temperature=0.0, max_new_tokens=8, batch_size=4)
    small = LlamaCppSampler(trainer.model, trainer.tokenizer, generation, base_gguf(spec),
                            work_dir=smollm2_folder.parent, context=256)
    turns = small.respond(prompts() + prompts()[:1])  # 4 rows of ~60 prompt tokens + 8 new: > 256 cells
    assert len(turns) == 4 and all(t.completion_tokens >= 1 for t in turns)
    long = [[{"role": "user", "content": "seven " * 400}]]
    with pytest.raises(InputError, match="context"):
        small.respond(long)


def test_the_llama_cpp_engine_needs_a_gguf_base():
    with pytest.raises(InputError, match="GGUF"):
        controller_for(torch.nn.Linear(2, 2), None, GenerationSettings(engine="llama_cpp"))
