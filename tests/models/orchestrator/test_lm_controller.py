"""LMController on the real SmolLM2-135M-Instruct: batched greedy generation is deterministic and equal
to one-at-a-time generation (left padding is right), and the reported log-probs are the policy's."""

from __future__ import annotations

import math

import pytest
import torch

from models.orchestrator.config import DeviceUnavailable, GenerationSettings
from models.orchestrator.lm import LMController, load_controller_model, resolve_device
from routerops.orchestra.controller import Controller

MAX_NEW = 12
# Generation's cached, left-padded forwards and one unpadded forward sum in different orders: their
# float32 log-probs differ by ~2e-4 (measured); a wrong temperature or a truncated policy by far more.
TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def loaded(spec):
    return load_controller_model(spec)


def controller(loaded, **settings) -> LMController:
    model, tokenizer = loaded
    return LMController(model, tokenizer, GenerationSettings(max_new_tokens=MAX_NEW, **settings))


def prompts(conversations):
    """Prompts of different lengths: the task alone, and the task with a turn and an observation."""
    return [conversations[0][:2], conversations[1][:4], conversations[2][:2]]


def teacher_forced_logprobs(model, tokenizer, messages, token_ids, temperature=1.0) -> list[float]:
    """log π(token | prefix) of the given continuation, from one forward pass over prompt + tokens."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = torch.tensor([ids + list(token_ids)])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0, len(ids) - 1:-1] / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


@pytest.mark.slow
def test_greedy_batch_is_deterministic_equal_to_single_calls_and_its_logprobs_are_the_models(loaded, conversations):
    lm = controller(loaded)
    contract: Controller = lm  # the executor's protocol (structural)
    assert contract.name
    batch = prompts(conversations)
    turns = lm.respond(batch)
    assert lm.respond(batch) == turns
    assert [lm.respond([c])[0].token_ids for c in batch] == [t.token_ids for t in turns]
    model, tokenizer = loaded
    for messages, turn in zip(batch, turns):
        assert 0 < turn.completion_tokens == len(turn.token_ids) == len(turn.token_logprobs) <= MAX_NEW
        assert turn.prompt_tokens == len(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
        assert all(math.isfinite(x) and x <= 0 for x in turn.token_logprobs)
        assert turn.text == tokenizer.decode(turn.token_ids, skip_special_tokens=True)
        assert turn.token_logprobs == pytest.approx(teacher_forced_logprobs(model, tokenizer, messages, turn.token_ids), abs=TOLERANCE)
        ended = turn.token_ids[-1] in lm.eos
        assert ended or turn.completion_tokens == MAX_NEW  # a turn stops at its end-of-turn token or the cap
        assert not any(t in lm.eos for t in turn.token_ids[:-1])


@pytest.mark.slow
def test_sampling_is_seeded_and_reports_the_tempered_policy(loaded, conversations):
    batch = prompts(conversations)
    first = controller(loaded, temperature=0.7, seed=5).respond(batch)
    assert controller(loaded, temperature=0.7, seed=5).respond(batch) == first
    model, tokenizer = loaded
    # top_p = 1: the sampling policy is softmax(logits / T), exactly.
    for messages, turn in zip(batch, first):
        expected = teacher_forced_logprobs(model, tokenizer, messages, turn.token_ids, temperature=0.7)
        assert turn.token_logprobs == pytest.approx(expected, abs=TOLERANCE)
    nucleus = controller(loaded, temperature=0.7, top_p=0.5, seed=5).respond(batch)
    assert all(math.isfinite(x) and x <= 0 for t in nucleus for x in t.token_logprobs)


def test_malformed_conversations_and_missing_devices_are_refused(loaded):
    lm = controller(loaded)
    with pytest.raises(ValueError, match="conversation 1: message 0: role 'tool'"):
        lm.respond([[{"role": "user", "content": "hi"}], [{"role": "tool", "content": "x"}]])
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable, match="no CUDA device"):
            resolve_device("cuda", "configs/paper/orchestra.yaml")
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
